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

/// An upstream video tower case (`fixtures/outputs/<name>.safetensors`, from
/// `oracle/fam_video.py`): every frame `[N, H, W, 3]` as raw RGB bytes, its metadata (no
/// duration in these cases), the setting its video processor config names (gemma4
/// `num_frames`; 0 = the config's) and upstream's true-f64 rows (`f64/rows`).
pub struct VideoCase {
    pub raw: Vec<u8>,
    pub n: usize,
    pub width: u32,
    pub height: u32,
    pub fps: f64,
    pub num_frames: u64,
    pub reference: Vec<f64>,
}

/// The video tower case `name` (e.g. `glm5_next_video/fps1_odd7`).
pub fn video_case(name: &str) -> VideoCase {
    let path = fixtures().join(format!("outputs/{name}.safetensors"));
    let ck = vision_towers::st_reader::Checkpoint::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let meta: serde_json::Value =
        serde_json::from_str(ck.metadata().get("fixture").expect("fixture metadata")).unwrap();
    assert_eq!(meta["kind"], "tower", "{name}");
    assert!(
        meta["video_metadata"]["duration"].is_null(),
        "{name}: a case with a duration (VideoCase has none)"
    );
    let frames = ck.tensor("frames_u8").expect("frames_u8");
    let shape = frames.shape().to_vec();
    let reference = ck
        .tensor("f64/rows")
        .expect("f64/rows")
        .bytes()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    VideoCase {
        raw: frames.bytes().to_vec(),
        n: shape[0],
        width: shape[2] as u32,
        height: shape[1] as u32,
        fps: meta["video_metadata"]["fps"].as_f64().expect("fps"),
        num_frames: meta["video_processor_config"]["num_frames"]
            .as_u64()
            .unwrap_or(0),
        reference,
    }
}

impl VideoCase {
    /// Every frame's bytes, in order.
    pub fn frames(&self) -> Vec<&[u8]> {
        self.raw
            .chunks_exact(self.width as usize * self.height as usize * 3)
            .collect()
    }

    /// The metadata as the Rust API takes it.
    pub fn metadata(&self) -> vision_towers::vision_prep::VideoMetadata {
        vision_towers::vision_prep::VideoMetadata {
            total_num_frames: self.n as u64,
            fps: Some(self.fps),
            duration: None,
        }
    }

    /// The settings as the Rust API takes them.
    pub fn settings(&self) -> vision_towers::vision_prep::video::VideoSettings {
        vision_towers::vision_prep::video::VideoSettings {
            num_frames: (self.num_frames != 0).then_some(self.num_frames),
            ..Default::default()
        }
    }

    /// The video for the C ABI: its raw frames (borrowed from `self`).
    pub fn vt_video(&self) -> vision_towers_c::vt_video {
        vision_towers_c::vt_video {
            frames: std::ptr::null(),
            rgb: self.raw.as_ptr(),
            rgb_len: self.raw.len(),
            n_frames: self.n,
            width: self.width,
            height: self.height,
            fps: self.fps,
            duration: 0.0,
        }
    }

    /// The settings for the C ABI.
    pub fn vt_settings(&self) -> vision_towers_c::vt_video_settings {
        vision_towers_c::vt_video_settings {
            num_frames: self.num_frames,
            ..vision_towers_c::vt_video_settings_default()
        }
    }
}

/// A 24-bit BMP of an RGB frame (bottom-up rows, BGR, rows padded to 4 bytes): lossless.
pub fn bmp(rgb: &[u8], w: u32, h: u32) -> Vec<u8> {
    let stride = (w as usize * 3).div_ceil(4) * 4;
    let size = 54 + stride * h as usize;
    let mut out = Vec::with_capacity(size);
    out.extend(b"BM");
    out.extend((size as u32).to_le_bytes());
    out.extend([0u8; 4]);
    out.extend(54u32.to_le_bytes());
    out.extend(40u32.to_le_bytes());
    out.extend((w as i32).to_le_bytes());
    out.extend((h as i32).to_le_bytes());
    out.extend(1u16.to_le_bytes());
    out.extend(24u16.to_le_bytes());
    out.extend([0u8; 24]);
    for y in (0..h as usize).rev() {
        let row = &rgb[y * w as usize * 3..(y + 1) * w as usize * 3];
        let start = out.len();
        for p in row.chunks_exact(3) {
            out.extend([p[2], p[1], p[0]]);
        }
        out.resize(start + stride, 0);
    }
    out
}

/// BMP files of the case's frames cut to their 54-byte headers: the headers plan the video (its
/// size), but a frame decoded is refused (no pixels), so a call that answers from the plan alone
/// shows that nothing was decoded.
pub fn header_only_bmps(c: &VideoCase) -> Vec<Vec<u8>> {
    c.frames()
        .iter()
        .map(|f| bmp(f, c.width, c.height)[..54].to_vec())
        .collect()
}
