//! Where gpu-core's cuBLASLt comes from, and the calls into it.
//!
//! cudarc loads cuBLASLt by name, `libcublasLt.so` first. In a PyTorch process that is a second
//! copy: torch has already mapped its own (the pip wheel's `libcublasLt.so.13`, found by its
//! SONAME), while `libcublasLt.so` is the CUDA toolkit's development link, a different file.
//! Two cuBLASLt copies in one process cost memory and each keeps its own heuristics cache; a
//! toolkit older than the wheel's mixes versions. So gpu-core opens the library itself, in this
//! order ([`search_order`]):
//! 1. a copy already mapped in the process (`/proc/self/maps`), opened by its path: the same
//!    object, not a second one;
//! 2. the NVIDIA pip wheels' folders (`nvidia/cu13/lib`, then `nvidia/cublas/lib`) under every
//!    `site-packages` or `dist-packages` folder the process has mapped a file from (a Python
//!    process has mapped its extension modules from there);
//! 3. the system, by the SONAME ([`CUBLASLT_SONAME`]), then by the development name.
//!
//! The calls below have cudarc's `cublaslt::result` shapes (same `sys` types, same
//! [`CublasError`]) but go through the library found here; nothing in gpu-core calls cudarc's
//! own cuBLASLt loader.
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::cublaslt::result::CublasError;
use cudarc::cublaslt::sys;

/// The cuBLASLt of CUDA 13 by its SONAME (what the pip wheels and the toolkit both ship).
pub const CUBLASLT_SONAME: &str = "libcublasLt.so.13";

/// The toolkit's development link, the last name tried.
const CUBLASLT_DEV_NAME: &str = "libcublasLt.so";

/// Folders of NVIDIA's pip wheels, under a `site-packages`, that hold cuBLASLt: the CUDA 13
/// wheels put every library in `nvidia/cu13/lib`; the older per-library wheel layout used
/// `nvidia/cublas/lib`.
const PIP_WHEEL_DIRS: [&str; 2] = ["nvidia/cu13/lib", "nvidia/cublas/lib"];

/// How the cuBLASLt in use was found (the rules of the module docs, in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LtSource {
    /// Already mapped in the process (e.g. PyTorch's): the same copy.
    InProcess,
    /// An NVIDIA pip wheel's folder.
    PipWheel,
    /// The system's library search (`LD_LIBRARY_PATH`, the loader cache, system folders).
    System,
}

impl LtSource {
    /// Short name for logs and metadata.
    pub fn name(self) -> &'static str {
        match self {
            LtSource::InProcess => "already in the process",
            LtSource::PipWheel => "pip wheel",
            LtSource::System => "system",
        }
    }
}

/// One place to try: a path (rules 1 and 2) or a name for the system search (rule 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LtCandidate {
    /// A full path, or a bare library name for the loader's search.
    pub path: PathBuf,
    /// Which rule gave it.
    pub source: LtSource,
}

/// The places to try, in order, given the process's memory map (`/proc/self/maps` text) and a
/// test of whether a file exists.
pub fn search_order(maps: &str, exists: impl Fn(&Path) -> bool) -> Vec<LtCandidate> {
    let mut out: Vec<LtCandidate> = Vec::new();
    let mut push = |path: PathBuf, source| {
        if !out.iter().any(|c| c.path == path) {
            out.push(LtCandidate { path, source });
        }
    };
    let mapped: Vec<&Path> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with('/'))
        .map(Path::new)
        .collect();
    for p in &mapped {
        let is_lt = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(CUBLASLT_DEV_NAME));
        if is_lt {
            push(p.to_path_buf(), LtSource::InProcess);
        }
    }
    let mut sites: Vec<PathBuf> = Vec::new();
    for p in &mapped {
        let mut dir = PathBuf::new();
        for c in p.components() {
            dir.push(c);
            let name = c.as_os_str();
            if name == "site-packages" || name == "dist-packages" {
                if !sites.contains(&dir) {
                    sites.push(dir.clone());
                }
                break;
            }
        }
    }
    for site in &sites {
        for sub in PIP_WHEEL_DIRS {
            let p = site.join(sub).join(CUBLASLT_SONAME);
            if exists(&p) {
                push(p, LtSource::PipWheel);
            }
        }
    }
    push(PathBuf::from(CUBLASLT_SONAME), LtSource::System);
    push(PathBuf::from(CUBLASLT_DEV_NAME), LtSource::System);
    out
}

type Status = sys::cublasStatus_t;
type Handle = sys::cublasLtHandle_t;
type Layout = sys::cublasLtMatrixLayout_t;
type Desc = sys::cublasLtMatmulDesc_t;
type Pref = sys::cublasLtMatmulPreference_t;

/// The cuBLASLt entry points gpu-core calls, resolved once.
struct Fns {
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    layout_create: unsafe extern "C" fn(*mut Layout, sys::cudaDataType, u64, u64, i64) -> Status,
    layout_destroy: unsafe extern "C" fn(Layout) -> Status,
    desc_create:
        unsafe extern "C" fn(*mut Desc, sys::cublasComputeType_t, sys::cudaDataType_t) -> Status,
    desc_destroy: unsafe extern "C" fn(Desc) -> Status,
    desc_set: unsafe extern "C" fn(
        Desc,
        sys::cublasLtMatmulDescAttributes_t,
        *const c_void,
        usize,
    ) -> Status,
    pref_create: unsafe extern "C" fn(*mut Pref) -> Status,
    pref_destroy: unsafe extern "C" fn(Pref) -> Status,
    pref_set: unsafe extern "C" fn(
        Pref,
        sys::cublasLtMatmulPreferenceAttributes_t,
        *const c_void,
        usize,
    ) -> Status,
    heuristic: unsafe extern "C" fn(
        Handle,
        Desc,
        Layout,
        Layout,
        Layout,
        Layout,
        Pref,
        std::ffi::c_int,
        *mut sys::cublasLtMatmulHeuristicResult_t,
        *mut std::ffi::c_int,
    ) -> Status,
    #[allow(clippy::type_complexity)] // cuBLASLt's own signature
    matmul: unsafe extern "C" fn(
        Handle,
        Desc,
        *const c_void,
        *const c_void,
        Layout,
        *const c_void,
        Layout,
        *const c_void,
        *const c_void,
        Layout,
        *mut c_void,
        Layout,
        *const sys::cublasLtMatmulAlgo_t,
        *mut c_void,
        usize,
        sys::cudaStream_t,
    ) -> Status,
    version: unsafe extern "C" fn() -> usize,
}

/// The cuBLASLt in use: where it was found and its entry points.
pub struct LtLibrary {
    /// What was opened: a full path, or the name the system search resolved.
    pub path: PathBuf,
    /// Which rule found it.
    pub source: LtSource,
    /// `cublasLtGetVersion()` (e.g. 130100 for 13.1.0).
    pub version: usize,
    fns: Fns,
    // kept open for the process's life: the function pointers above point into it
    _lib: libloading::Library,
}

impl std::fmt::Debug for LtLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LtLibrary")
            .field("path", &self.path)
            .field("source", &self.source)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// Resolves every entry point of `lib`.
///
/// # Safety
/// `lib` must be a cuBLASLt of CUDA 13 (the signatures are cudarc's `sys` ones for it).
unsafe fn resolve(lib: &libloading::Library) -> Result<Fns, libloading::Error> {
    Ok(Fns {
        create: *lib.get(b"cublasLtCreate\0")?,
        destroy: *lib.get(b"cublasLtDestroy\0")?,
        layout_create: *lib.get(b"cublasLtMatrixLayoutCreate\0")?,
        layout_destroy: *lib.get(b"cublasLtMatrixLayoutDestroy\0")?,
        desc_create: *lib.get(b"cublasLtMatmulDescCreate\0")?,
        desc_destroy: *lib.get(b"cublasLtMatmulDescDestroy\0")?,
        desc_set: *lib.get(b"cublasLtMatmulDescSetAttribute\0")?,
        pref_create: *lib.get(b"cublasLtMatmulPreferenceCreate\0")?,
        pref_destroy: *lib.get(b"cublasLtMatmulPreferenceDestroy\0")?,
        pref_set: *lib.get(b"cublasLtMatmulPreferenceSetAttribute\0")?,
        heuristic: *lib.get(b"cublasLtMatmulAlgoGetHeuristic\0")?,
        matmul: *lib.get(b"cublasLtMatmul\0")?,
        version: *lib.get(b"cublasLtGetVersion\0")?,
    })
}

fn open() -> Result<LtLibrary, String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let order = search_order(&maps, |p| p.is_file());
    let mut tried = Vec::with_capacity(order.len());
    for c in order {
        // SAFETY: loading cuBLASLt runs its initialisers, which have no preconditions.
        let lib = match unsafe { libloading::Library::new(&c.path) } {
            Ok(lib) => lib,
            Err(e) => {
                tried.push(format!("{} ({}): {e}", c.path.display(), c.source.name()));
                continue;
            }
        };
        // SAFETY: a library named cuBLASLt of CUDA 13 (its SONAME or a path found by it).
        match unsafe { resolve(&lib) } {
            Ok(fns) => {
                // SAFETY: cublasLtGetVersion takes nothing and has no preconditions.
                let version = unsafe { (fns.version)() };
                return Ok(LtLibrary {
                    path: c.path,
                    source: c.source,
                    version,
                    fns,
                    _lib: lib,
                });
            }
            Err(e) => tried.push(format!(
                "{} ({}): lacks an entry point: {e}",
                c.path.display(),
                c.source.name()
            )),
        }
    }
    Err(format!(
        "the cuBLASLt library ({CUBLASLT_SONAME}) was not found; tried: {}",
        tried.join("; ")
    ))
}

/// The cuBLASLt in use, found and opened on the first call (the search of the module docs);
/// the error says every place tried and why each failed.
pub fn cublaslt() -> Result<&'static LtLibrary, &'static str> {
    static LIB: OnceLock<Result<LtLibrary, String>> = OnceLock::new();
    LIB.get_or_init(open).as_ref().map_err(String::as_str)
}

/// The library, or cuBLASLt's "not initialized" status where none loads (the device refuses
/// to open before this can happen: `device::probe`).
fn fns() -> Result<&'static Fns, CublasError> {
    cublaslt()
        .map(|l| &l.fns)
        .map_err(|_| CublasError(Status::CUBLAS_STATUS_NOT_INITIALIZED))
}

/// Runs a cuBLASLt call that writes its result through a pointer (its "create" calls).
///
/// # Safety
/// `call` must write a valid `T` through the pointer whenever it returns success.
unsafe fn written<T>(call: impl FnOnce(*mut T) -> Status) -> Result<T, CublasError> {
    let mut v = std::mem::MaybeUninit::uninit();
    call(v.as_mut_ptr()).result()?;
    Ok(v.assume_init())
}

pub(crate) fn create_handle() -> Result<Handle, CublasError> {
    let f = fns()?.create;
    // SAFETY: cublasLtCreate writes the handle it returns success for.
    unsafe { written(|p| f(p)) }
}

/// # Safety
/// `h` came from [`create_handle`] and is destroyed once.
pub(crate) unsafe fn destroy_handle(h: Handle) -> Result<(), CublasError> {
    (fns()?.destroy)(h).result()
}

pub(crate) fn create_matrix_layout(
    t: sys::cudaDataType,
    rows: u64,
    cols: u64,
    ld: i64,
) -> Result<Layout, CublasError> {
    let f = fns()?.layout_create;
    // SAFETY: cublasLtMatrixLayoutCreate writes the layout it returns success for.
    unsafe { written(|p| f(p, t, rows, cols, ld)) }
}

/// # Safety
/// `l` came from [`create_matrix_layout`] and is destroyed once.
pub(crate) unsafe fn destroy_matrix_layout(l: Layout) -> Result<(), CublasError> {
    (fns()?.layout_destroy)(l).result()
}

pub(crate) fn create_matmul_desc(
    compute: sys::cublasComputeType_t,
    scale: sys::cudaDataType_t,
) -> Result<Desc, CublasError> {
    let f = fns()?.desc_create;
    // SAFETY: cublasLtMatmulDescCreate writes the descriptor it returns success for.
    unsafe { written(|p| f(p, compute, scale)) }
}

/// # Safety
/// `d` came from [`create_matmul_desc`] and is destroyed once.
pub(crate) unsafe fn destroy_matmul_desc(d: Desc) -> Result<(), CublasError> {
    (fns()?.desc_destroy)(d).result()
}

/// # Safety
/// `buf` points to `size` readable bytes of the attribute's type.
pub(crate) unsafe fn set_matmul_desc_attribute(
    d: Desc,
    attr: sys::cublasLtMatmulDescAttributes_t,
    buf: *const c_void,
    size: usize,
) -> Result<(), CublasError> {
    (fns()?.desc_set)(d, attr, buf, size).result()
}

pub(crate) fn create_matmul_pref() -> Result<Pref, CublasError> {
    let f = fns()?.pref_create;
    // SAFETY: cublasLtMatmulPreferenceCreate writes the preference it returns success for.
    unsafe { written(|p| f(p)) }
}

/// # Safety
/// `p` came from [`create_matmul_pref`] and is destroyed once.
pub(crate) unsafe fn destroy_matmul_pref(p: Pref) -> Result<(), CublasError> {
    (fns()?.pref_destroy)(p).result()
}

/// # Safety
/// `buf` points to `size` readable bytes of the attribute's type.
pub(crate) unsafe fn set_matmul_pref_attribute(
    p: Pref,
    attr: sys::cublasLtMatmulPreferenceAttributes_t,
    buf: *const c_void,
    size: usize,
) -> Result<(), CublasError> {
    (fns()?.pref_set)(p, attr, buf, size).result()
}

/// Up to `out.len()` algorithms for the problem, best first; how many were written.
///
/// # Safety
/// Every descriptor is live and describes the problem.
#[allow(clippy::too_many_arguments)] // cuBLASLt's own signature
pub(crate) unsafe fn algo_get_heuristic(
    h: Handle,
    d: Desc,
    a: Layout,
    b: Layout,
    c: Layout,
    dl: Layout,
    p: Pref,
    out: &mut [sys::cublasLtMatmulHeuristicResult_t],
) -> Result<usize, CublasError> {
    let mut found: std::ffi::c_int = 0;
    let want = std::ffi::c_int::try_from(out.len()).unwrap_or(std::ffi::c_int::MAX);
    (fns()?.heuristic)(h, d, a, b, c, dl, p, want, out.as_mut_ptr(), &mut found).result()?;
    Ok(usize::try_from(found).unwrap_or(0).min(out.len()))
}

/// `D = alpha·op(A)·op(B) + beta·C` with the descriptors' layouts, queued on `stream`.
///
/// # Safety
/// Every pointer is device memory of the extents its layout describes (or the scalars' host
/// memory), live until the launch completes on `stream`.
#[allow(clippy::too_many_arguments)] // cuBLASLt's own signature
pub(crate) unsafe fn matmul(
    h: Handle,
    desc: Desc,
    alpha: *const c_void,
    beta: *const c_void,
    a: *const c_void,
    a_layout: Layout,
    b: *const c_void,
    b_layout: Layout,
    c: *const c_void,
    c_layout: Layout,
    d: *mut c_void,
    d_layout: Layout,
    algo: *const sys::cublasLtMatmulAlgo_t,
    workspace: *mut c_void,
    workspace_size: usize,
    stream: sys::cudaStream_t,
) -> Result<(), CublasError> {
    (fns()?.matmul)(
        h,
        desc,
        alpha,
        a,
        a_layout,
        b,
        b_layout,
        beta,
        c,
        c_layout,
        d,
        d_layout,
        algo,
        workspace,
        workspace_size,
        stream,
    )
    .result()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(v: &[LtCandidate]) -> Vec<(String, LtSource)> {
        v.iter()
            .map(|c| (c.path.display().to_string(), c.source))
            .collect()
    }

    #[test]
    fn a_mapped_copy_comes_first_then_the_wheels_then_the_system() {
        let maps = "\
7f0000000000-7f0000001000 r-xp 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000002000-7f0000003000 r-xp 00000000 08:01 124 /venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so
7f0000004000-7f0000005000 r-xp 00000000 08:01 125 /venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublasLt.so.13
7f0000005000-7f0000006000 r--p 00001000 08:01 125 /venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublasLt.so.13
7f0000007000-7f0000008000 rw-p 00000000 00:00 0 [heap]
7f0000009000-7f000000a000 r-xp 00000000 08:01 126 /other/dist-packages/vision_towers/_native.abi3.so
";
        let exists = |p: &Path| {
            p == Path::new("/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublasLt.so.13")
                || p == Path::new("/other/dist-packages/nvidia/cublas/lib/libcublasLt.so.13")
        };
        let got = paths(&search_order(maps, exists));
        let want = [
            (
                "/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublasLt.so.13",
                LtSource::InProcess,
            ),
            (
                "/other/dist-packages/nvidia/cublas/lib/libcublasLt.so.13",
                LtSource::PipWheel,
            ),
            ("libcublasLt.so.13", LtSource::System),
            ("libcublasLt.so", LtSource::System),
        ];
        let want: Vec<(String, LtSource)> = want.iter().map(|(p, s)| (p.to_string(), *s)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn without_python_or_a_mapped_copy_the_system_is_searched_by_soname_first() {
        let maps = "7f0000000000-7f0000001000 r-xp 00000000 08:01 1 /usr/bin/vtower\n";
        let got = paths(&search_order(maps, |_| true));
        assert_eq!(
            got,
            vec![
                ("libcublasLt.so.13".to_string(), LtSource::System),
                ("libcublasLt.so".to_string(), LtSource::System),
            ]
        );
    }

    #[test]
    fn wheel_folders_are_tried_in_order_and_only_where_the_file_is() {
        let maps = "1-2 r-xp 0 0:0 1 /s/site-packages/a.so\n";
        let got = paths(&search_order(maps, |_| true));
        assert_eq!(
            got[0].0,
            "/s/site-packages/nvidia/cu13/lib/libcublasLt.so.13"
        );
        assert_eq!(
            got[1].0,
            "/s/site-packages/nvidia/cublas/lib/libcublasLt.so.13"
        );
        assert_eq!(got[1].1, LtSource::PipWheel);
        let none = search_order(maps, |_| false);
        assert!(none.iter().all(|c| c.source == LtSource::System));
    }

    #[test]
    fn the_library_loads_or_the_error_names_every_place_tried() {
        // without CUDA (CI) the error says what was tried, never a panic; with it, a CUDA 13
        // library with every entry point
        match cublaslt() {
            Err(e) => {
                assert!(e.contains(CUBLASLT_SONAME), "{e}");
                assert!(e.contains("system"), "{e}");
            }
            Ok(l) => assert!((130_000..140_000).contains(&l.version), "{l:?}"),
        }
    }
}
