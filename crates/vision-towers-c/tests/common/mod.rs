//! What the C ABI tests share: where the fixtures and the built library are, building the C
//! test program (`tests/c/vt_ctest.c`) with the system compiler, running a script through it
//! (optionally under valgrind) and reading its result lines.
//!
//! Paths, for a machine without this checkout or without cargo (the test binaries carried to a
//! GPU machine):
//! - `VT_FIXTURES`: the fixtures folder (default: this checkout's `fixtures/`);
//! - `VT_CAPI_LIB_DIR`: the folder holding `libvision_towers_c.so` / `.a` (default: the cargo
//!   target folder this test binary was built into);
//! - `VT_CTEST`: a prebuilt `vt_ctest` (default: built here with `$CC` or `cc`);
//! - `VT_CAPI_INCLUDE`: the folder holding `vision_towers.h` (default: this crate's `include/`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub fn fixtures() -> PathBuf {
    std::env::var_os("VT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"))
}

pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn include_dir() -> PathBuf {
    std::env::var_os("VT_CAPI_INCLUDE")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate_dir().join("include"))
}

/// A scratch folder of this test binary (removed by nobody: under the target's tmp folder).
pub fn scratch(name: &str) -> PathBuf {
    let base = std::env::var_os("VT_CAPI_SCRATCH")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    let dir = base.join(format!("capi-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

/// The folder with the library cargo built next to this test: `target/<profile>/deps` (always
/// the fresh one: cargo builds the cdylib and staticlib with the rlib the test links), or
/// `VT_CAPI_LIB_DIR`.
pub fn lib_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("VT_CAPI_LIB_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps folder").to_path_buf();
    for dir in [
        deps.clone(),
        deps.parent().map(Path::to_path_buf).unwrap_or_default(),
    ] {
        if dir.join("libvision_towers_c.so").exists() {
            return dir;
        }
    }
    panic!(
        "no libvision_towers_c.so next to {} (set VT_CAPI_LIB_DIR)",
        exe.display()
    );
}

pub fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

pub fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

/// The system libraries the static library needs (`rustc --print native-static-libs`).
pub const STATIC_LIBS: [&str; 6] = ["-lpthread", "-ldl", "-lm", "-lrt", "-lutil", "-lgcc_s"];

/// Compiles with `compiler`, failing the test with the compiler's output.
pub fn compile(compiler: &str, args: &[&std::ffi::OsStr]) {
    let out = Command::new(compiler)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} {:?} failed:\n{}{}",
        args,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `vt_ctest`, built once per test binary against the header and the shared library (or
/// `VT_CTEST`).
pub fn ctest() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("VT_CTEST") {
            return PathBuf::from(p);
        }
        let lib = lib_dir();
        let out = scratch("bin").join("vt_ctest");
        let src = crate_dir().join("tests/c/vt_ctest.c");
        let inc = include_dir();
        let rpath = format!("-Wl,-rpath,{}", lib.display());
        let args: Vec<&std::ffi::OsStr> = vec![
            "-std=c11".as_ref(),
            "-Wall".as_ref(),
            "-Wextra".as_ref(),
            "-Werror".as_ref(),
            "-g".as_ref(),
            "-I".as_ref(),
            inc.as_os_str(),
            src.as_os_str(),
            "-o".as_ref(),
            out.as_os_str(),
            "-L".as_ref(),
            lib.as_os_str(),
            "-lvision_towers_c".as_ref(),
            rpath.as_ref(),
            "-lpthread".as_ref(),
            "-ldl".as_ref(),
        ];
        compile(&cc(), &args);
        out
    })
}

/// A command for a program linked against the library: `LD_LIBRARY_PATH` starts with
/// [`lib_dir`], since cargo's own `LD_LIBRARY_PATH` (which outranks the binary's RUNPATH) may
/// name `target/<profile>/`, where an older copy of the library can lie.
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    let mut paths = vec![lib_dir()];
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        paths.extend(std::env::split_paths(&old));
    }
    c.env(
        "LD_LIBRARY_PATH",
        std::env::join_paths(paths).expect("library path"),
    );
    c
}

/// One result line of `vt_ctest`: its fields (the command first, then the status name).
#[derive(Debug, Clone)]
pub struct Line(pub Vec<String>);

impl Line {
    pub fn cmd(&self) -> &str {
        &self.0[0]
    }
    pub fn status(&self) -> &str {
        self.0.get(1).map_or("", String::as_str)
    }
    pub fn field(&self, i: usize) -> &str {
        self.0.get(i).map_or("", String::as_str)
    }
    /// The message: the last field.
    pub fn message(&self) -> &str {
        self.0.last().map_or("", String::as_str)
    }
}

/// What a run of `vt_ctest` gave.
pub struct Run {
    pub lines: Vec<Line>,
    pub stderr: String,
    pub seconds: f64,
}

/// How to run `vt_ctest`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Under {
    Plain,
    /// valgrind memcheck: any error or definite/indirect leak fails the run (exit 99).
    Valgrind,
}

/// Runs `script` through `vt_ctest`; panics unless it exits 0.
pub fn run_script(script: &str, under: Under, name: &str) -> Run {
    let dir = scratch("scripts");
    let path = dir.join(format!("{name}.txt"));
    std::fs::write(&path, script).expect("script");
    let mut cmd = match under {
        Under::Plain => command(ctest()),
        Under::Valgrind => {
            let mut c = command("valgrind");
            c.args([
                "--error-exitcode=99",
                "--leak-check=full",
                "--errors-for-leak-kinds=definite,indirect",
                "--show-leak-kinds=definite,indirect",
                "--track-origins=yes",
                "--quiet",
            ])
            .arg(ctest());
            c
        }
    };
    // Two pool threads whatever the machine (as on CI); no backtrace printing on the test
    // hook's panic.
    cmd.arg(&path)
        .env("RAYON_NUM_THREADS", "2")
        .env("RUST_BACKTRACE", "0");
    let start = std::time::Instant::now();
    let out = cmd.output().expect("vt_ctest runs");
    let seconds = start.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "vt_ctest {name} ({}) exited {:?}:\nstderr:\n{stderr}\nstdout (last lines):\n{}",
        if under == Under::Valgrind {
            "under valgrind"
        } else {
            "plain"
        },
        out.status,
        stdout
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let lines = stdout
        .lines()
        .map(|l| Line(l.split('\t').map(str::to_string).collect()))
        .collect();
    Run {
        lines,
        stderr,
        seconds,
    }
}

/// A script line from fields.
pub fn line(fields: &[&dyn std::fmt::Display]) -> String {
    let mut s = fields
        .iter()
        .map(|f| f.to_string())
        .collect::<Vec<_>>()
        .join("\t");
    s.push('\n');
    s
}

/// Little-endian f32 values of a file's bytes.
pub fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// An image as a script argument: `file:<path>`.
pub fn file_arg(path: &Path) -> String {
    format!("file:{}", path.display())
}

/// The processor tensors of a tower fixture (`fixtures/outputs/<case>.safetensors`, the
/// upstream processor's output for its images) as (name, shape, values) lists.
pub type TensorList = Vec<(String, Vec<usize>, TensorValues)>;

#[derive(Debug, Clone)]
pub enum TensorValues {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

/// The tensors of a safetensors file as `vtower prep` writes them and
/// `Tower::encode_prepared_file` reads them: I64 as i64, U8/BOOL widened to i64, floats as f32,
/// other dtypes skipped; `skip` says which names to leave out. Errors as text.
pub fn tensors_of_file(path: &Path, keep: impl Fn(&str) -> bool) -> Result<TensorList, String> {
    let ck = vision_towers::st_reader::Checkpoint::open(path).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for info in ck.tensors() {
        if !keep(&info.name) {
            continue;
        }
        let v = ck
            .tensor(&info.name)
            .ok_or_else(|| format!("tensor {} vanished", info.name))?;
        let shape = v.shape().to_vec();
        let values = match v.dtype().as_str() {
            "I64" => TensorValues::I64(
                v.bytes()
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect(),
            ),
            "U8" | "BOOL" => TensorValues::I64(v.bytes().iter().map(|&b| i64::from(b)).collect()),
            "F32" | "BF16" | "F16" => TensorValues::F32(v.to_f32().map_err(|e| e.to_string())?),
            _ => continue,
        };
        out.push((info.name.clone(), shape, values));
    }
    Ok(out)
}

/// The same tensors as the Rust API's `ProcessorTensors` (a shape error as text).
pub fn processor_tensors(list: &TensorList) -> Result<vision_towers::ProcessorTensors, String> {
    let mut t = vision_towers::ProcessorTensors::new();
    for (name, shape, values) in list {
        match values {
            TensorValues::F32(v) => t.insert_f32(name, shape.clone(), v.clone()),
            TensorValues::I64(v) => t.insert_i64(name, shape.clone(), v.clone()),
        }
        .map_err(|e| e.to_string())?;
    }
    Ok(t)
}

/// Script lines that build the same tensors in `vt_ctest` (values written to files in `dir`).
pub fn tensor_script(list: &TensorList, dir: &Path, tag: &str) -> String {
    let mut s = line(&[&"tensors_new"]);
    for (i, (name, shape, values)) in list.iter().enumerate() {
        let file = dir.join(format!("{tag}-t{i}.bin"));
        let (cmd, bytes): (&str, Vec<u8>) = match values {
            TensorValues::F32(v) => (
                "tensor_f32",
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            TensorValues::I64(v) => (
                "tensor_i64",
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
        };
        std::fs::write(&file, bytes).expect("tensor values");
        let dims = if shape.is_empty() {
            "-".to_string()
        } else {
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        s.push_str(&line(&[&cmd, name, &file.display(), &dims]));
    }
    s
}
