//! The adversarial corpus (`fixtures/adversarial/`, see its README) through the library and the
//! `vtower` command line.
//!
//! For every case of `fixtures/adversarial/manifest.json`:
//! - **library**: each operation the manifest names (`Model::plan` on all four families, the
//!   preprocessor's `prepare`, `Model::open` / `encode`, `WeightFile::open` + `inspect_json`,
//!   `preprocessor_for` + `plan`, `Tower::encode_prepared_file`) runs under `catch_unwind`; it
//!   must return `Ok` or an `Err` whose class (below) the manifest allows — never panic.
//! - **command line**: each run the manifest names must exit 0 when the library gives `Ok`, or
//!   exactly 1 with one line on stderr that carries the library's root-cause message — never 101
//!   or a signal — and its peak RSS (`wait4`'s `ru_maxrss`) must stay under [`CLI_RSS_BUDGET_MB`].
//!
//! Error classes: `prep:<PrepError variant>`, `gguf:<GgufError variant>`,
//! `safetensors:<StError variant>`, `tower:<GemmaError|GlmError|StepError variant>`,
//! `family:<UnknownFamily|NotImplemented>`, `inputs` (a prepared-input file the facade refuses),
//! `format:<…>`, `io`; `ns:*` in the manifest allows any variant of a namespace (weight files
//! only: image expectations are exact, from Pillow and the formats' headers, or say why not).
//!
//! Cases marked `known_failing` in the manifest are bugs reported and not yet fixed: they are
//! run (in-process only when the failure is a catchable panic; a hang or an unbounded allocation
//! runs only as a child process under a timeout and an address-space cap), reported by name
//! on every run, and the test fails if one of them starts passing so the mark gets removed.

use serde_json::Value;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vision_towers::vision_prep::{ImageSource, PrepSettings};
use vision_towers::{
    inspect_json, preprocessor_for, read_image_arg, Device, Model, ModelError, PrepOpenError,
    Tower, TowerError, WeightFile,
};

/// Peak resident set size allowed to one `vtower` run on any case of the corpus, in MiB.
///
/// Measured (`wait4`'s `ru_maxrss` of each child, debug build, 2026-11-29): the largest run is
/// `prep` of the admitted 16-megapixel zlib bomb (`body_png_zlib_bomb_4000x4000.png`: 47 KB
/// inflating to 48 MB of RGB) at 57 MiB; a refused input peaks at 6–8 MiB, a model encode at
/// 16 MiB, an image decode at 21 MiB. The budget leaves twice that headroom for allocators and
/// platforms while staying under what the smallest header bomb would need if it were decoded
/// (7072² RGB = 150 MB); the larger ones claim up to 10^19 bytes.
const CLI_RSS_BUDGET_MB: u64 = 128;

/// Address-space cap set on every child (`RLIMIT_AS`): a safety net so that a regression that
/// allocates without bound dies with an allocation failure (a signal the test reports) instead
/// of exhausting the CI machine. The budget above is the real check.
const CLI_ADDRESS_SPACE_CAP: u64 = 4 << 30;

/// A child that runs longer than this is killed and reported as a hang.
const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// Families whose fixture model every image case is planned with; the image cases rotate over
/// them for `prepare`, `encode` and the command line.
const FAMILIES: [&str; 4] = ["gemma4", "glm5_next", "glm_ocr", "step3p7"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn corpus() -> PathBuf {
    fixtures().join("adversarial")
}

// ---------------------------------------------------------------------------------------------
// Error classes
// ---------------------------------------------------------------------------------------------

/// The variant name of an error enum, from its `Debug` form (`OverBudget { … }` → `OverBudget`).
fn variant(e: &dyn std::fmt::Debug) -> String {
    let s = format!("{e:?}");
    s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .next()
        .unwrap_or_default()
        .to_string()
}

fn class_facade(e: &vision_towers::Error) -> String {
    use vision_towers::Error as E;
    match e {
        E::Gguf { source, .. } => format!("gguf:{}", variant(source)),
        E::SafeTensors { source, .. } => format!("safetensors:{}", variant(source)),
        E::Io { .. } => "io".into(),
        E::GgufDirectory { .. } => "format:GgufDirectory".into(),
        E::UnknownFormat { .. } => "format:UnknownFormat".into(),
    }
}

fn class_tower(e: &TowerError) -> String {
    match e {
        TowerError::Open(e) => class_facade(e),
        TowerError::UnknownFamily { .. } => "family:UnknownFamily".into(),
        TowerError::NotImplemented { .. } => "family:NotImplemented".into(),
        TowerError::Unsupported(_) => "unsupported".into(),
        TowerError::Refused { source, .. } => format!("tower:{}", variant(source)),
        TowerError::Inputs { .. } => "inputs".into(),
        TowerError::Pass { source, .. } => class_tower(source),
        // Device-side variants (no device, out of memory, …) never arise on the host path.
        other => format!("facade:{}", variant(other)),
    }
}

fn class_prep_open(e: &PrepOpenError) -> String {
    match e {
        PrepOpenError::Prep { source, .. } => format!("prep:{}", variant(source)),
        PrepOpenError::Tokenizer(e) => format!("safetensors:{}", variant(e)),
        PrepOpenError::Io { .. } => "io".into(),
        PrepOpenError::TooLarge { .. } => "io:TooLarge".into(),
    }
}

fn class_model(e: &ModelError) -> String {
    match e {
        ModelError::Tower(t) | ModelError::ImageRefused(t) => class_tower(t),
        ModelError::Prep(p) => class_prep_open(p),
        ModelError::Image { source, .. } => format!("prep:{}", variant(source)),
        ModelError::RowsOffPlan { .. } => "bug:RowsOffPlan".into(),
    }
}

/// What one library operation gave: `ok`, an error class with its root-cause message, or a panic.
#[derive(Debug, Clone)]
enum Outcome {
    Ok,
    Err { class: String, root: String },
    Panic(String),
}

impl Outcome {
    fn class(&self) -> &str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Err { class, .. } => class,
            Outcome::Panic(_) => "PANIC",
        }
    }
}

/// The deepest `source()` of an error: the message the command line's one line must carry.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string().replace('\n', " ")
}

fn err<E: std::error::Error + 'static>(class: String, e: &E) -> Outcome {
    Outcome::Err {
        class,
        root: root_cause(e),
    }
}

thread_local! {
    /// Set while this thread runs a library call under [`guarded`].
    static IN_GUARD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The last panic [`guarded`] caught on this thread, with its location.
    static CAUGHT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` and turns a panic into [`Outcome::Panic`] (its message and location). A panic on
/// the guarded thread is recorded instead of printed (no backtrace is symbolized for the
/// known-failing cases); any other panic goes to the default hook.
fn guarded(f: impl FnOnce() -> Outcome) -> Outcome {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_GUARD.with(|g| g.get()) {
                CAUGHT.with(|c| *c.borrow_mut() = Some(info.to_string().replace('\n', " ")));
            } else {
                default(info);
            }
        }));
    });
    let outer = IN_GUARD.with(|g| g.replace(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    IN_GUARD.with(|g| g.set(outer));
    let caught = CAUGHT.with(|c| c.borrow_mut().take());
    match result {
        Ok(o) => o,
        Err(p) => Outcome::Panic(caught.unwrap_or_else(|| {
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "non-string panic payload".into())
        })),
    }
}

fn allowed(expect: &[String], got: &str) -> bool {
    expect.iter().any(|p| {
        p == got
            || p.strip_suffix('*')
                .is_some_and(|ns| ns.ends_with(':') && got.starts_with(ns))
    })
}

// ---------------------------------------------------------------------------------------------
// Child processes with their peak RSS
// ---------------------------------------------------------------------------------------------

/// What one `vtower` run did.
struct CliRun {
    code: Option<i32>,
    signal: Option<i32>,
    stderr: String,
    max_rss_kib: u64,
    timed_out: bool,
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod sys {
    //! `wait4` (a child's own `ru_maxrss`) and `setrlimit`, declared against the C library that
    //! std already links, so the test needs no extra dependency (the lock file stays as is).

    /// `struct timeval` on 64-bit Linux.
    #[repr(C)]
    struct Timeval {
        sec: i64,
        usec: i64,
    }

    /// `struct rusage` on 64-bit Linux: two timevals, then fourteen `long`s with `ru_maxrss`
    /// (KiB) first.
    #[repr(C)]
    struct Rusage {
        utime: Timeval,
        stime: Timeval,
        maxrss: i64,
        rest: [i64; 13],
    }

    #[repr(C)]
    struct Rlimit {
        cur: u64,
        max: u64,
    }

    extern "C" {
        fn wait4(pid: i32, status: *mut i32, options: i32, rusage: *mut Rusage) -> i32;
        fn setrlimit(resource: i32, rlim: *const Rlimit) -> i32;
    }

    const RLIMIT_AS: i32 = 9;
    const WNOHANG: i32 = 1;

    /// Caps this process's address space; children inherit the cap.
    pub fn cap_address_space(bytes: u64) {
        let lim = Rlimit {
            cur: bytes,
            max: bytes,
        };
        // SAFETY: `lim` is a valid `struct rlimit` for the duration of the call.
        let r = unsafe { setrlimit(RLIMIT_AS, &lim) };
        assert_eq!(r, 0, "setrlimit: {}", std::io::Error::last_os_error());
    }

    /// Polls (or, with `block`, waits for) child `pid`; once it has exited it is reaped and
    /// `Some((wait status, ru_maxrss in KiB))` comes back.
    pub fn wait(pid: u32, block: bool) -> Option<(i32, u64)> {
        let mut status = 0i32;
        let mut ru = Rusage {
            utime: Timeval { sec: 0, usec: 0 },
            stime: Timeval { sec: 0, usec: 0 },
            maxrss: 0,
            rest: [0; 13],
        };
        loop {
            // SAFETY: `status` and `ru` are valid and writable and laid out as the kernel
            // expects on 64-bit Linux (this module exists only there); `pid` is a child of this
            // process that nothing else reaps (std's `Child::wait` is never called on it).
            let r = unsafe {
                wait4(
                    pid as i32,
                    &mut status,
                    if block { 0 } else { WNOHANG },
                    &mut ru,
                )
            };
            if r == pid as i32 {
                return Some((status, ru.maxrss.max(0) as u64));
            }
            if r == 0 {
                return None;
            }
            let e = std::io::Error::last_os_error();
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::Interrupted,
                "wait4 {pid}: {e}"
            );
        }
    }
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
mod sys {
    //! Elsewhere the corpus test is ignored; these are never called.
    pub fn cap_address_space(_: u64) {
        unimplemented!("64-bit Linux only")
    }
    pub fn wait(_: u32, _: bool) -> Option<(i32, u64)> {
        unimplemented!("64-bit Linux only")
    }
}

/// Runs `vtower args` from this process, with a timeout, and reads its exit and peak RSS.
// The child is reaped by `wait4` (`sys::wait`), which std's `Child::wait` cannot replace: it
// does not return the child's resource usage.
#[allow(clippy::zombie_processes)]
fn run_vtower(args: &[String], timeout: Duration) -> CliRun {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vtower"))
        .args(args)
        // Two pool threads whatever the machine (as on CI); no backtrace printing (a panic is
        // reported by its exit status and message, not measured by the symbolizer's memory).
        .env("RAYON_NUM_THREADS", "2")
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vtower starts");
    let mut pipe = child.stderr.take().expect("stderr pipe");
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = pipe.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let start = Instant::now();
    let mut sleep = Duration::from_micros(100);
    let (status, max_rss_kib, timed_out) = loop {
        if let Some((st, rss)) = sys::wait(child.id(), false) {
            break (st, rss, false);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let (st, rss) = sys::wait(child.id(), true).expect("reaped");
            break (st, rss, true);
        }
        std::thread::sleep(sleep);
        sleep = (sleep * 2).min(Duration::from_millis(4));
    };
    let (code, signal) = match status & 0x7f {
        0 => (Some((status >> 8) & 0xff), None),
        sig => (None, Some(sig)),
    };
    CliRun {
        code,
        signal,
        stderr: reader.join().expect("stderr reader"),
        max_rss_kib,
        timed_out,
    }
}

/// Turns the `cli_spawner` test into the spawner process (see [`Spawner`]).
const SPAWNER_ENV: &str = "VT_ADVERSARIAL_SPAWNER";
/// Marks the spawner's reply lines on its stdout (libtest prints its own lines there too).
const REPLY: &str = "@@vtower-run@@ ";

/// Runs `vtower` commands from a small process so that each one's `ru_maxrss` is its own.
///
/// Linux carries the parent's RSS high-water mark into a child's `ru_maxrss`: a child forked
/// (or vforked) from this test process, which holds the corpus and four models, would report at
/// least the test's own peak. The spawner is this test binary started afresh (a few MiB): it
/// caps its address space (inherited by every child), runs each requested command, reaps it
/// with `wait4` and answers one line.
struct Spawner {
    child: std::process::Child,
    requests: Option<std::process::ChildStdin>,
    replies: std::io::BufReader<std::process::ChildStdout>,
}

impl Spawner {
    fn start() -> Spawner {
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "cli_spawner", "--nocapture", "--test-threads=1"])
            .env(SPAWNER_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawner starts");
        Spawner {
            requests: child.stdin.take(),
            replies: std::io::BufReader::new(child.stdout.take().expect("spawner stdout")),
            child,
        }
    }

    fn run(&mut self, args: &[OsString], timeout: Duration) -> CliRun {
        use std::io::{BufRead, Write};
        let args: Vec<&str> = args
            .iter()
            .map(|a| a.to_str().expect("UTF-8 argument"))
            .collect();
        let req = serde_json::json!({"args": args, "timeout_ms": timeout.as_millis() as u64});
        let tx = self.requests.as_mut().expect("spawner stdin");
        writeln!(tx, "{req}").expect("request sent");
        tx.flush().expect("request flushed");
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.replies.read_line(&mut line).expect("spawner reply");
            assert!(n > 0, "the spawner exited");
            // libtest may have written "test cli_spawner ... " on the same line first.
            if let Some(at) = line.find(REPLY) {
                let reply = line[at + REPLY.len()..].trim_end();
                let v: Value = serde_json::from_str(reply).expect("reply is JSON");
                return CliRun {
                    code: v["code"].as_i64().map(|c| c as i32),
                    signal: v["signal"].as_i64().map(|c| c as i32),
                    stderr: v["stderr"].as_str().unwrap_or_default().to_string(),
                    max_rss_kib: v["max_rss_kib"].as_u64().unwrap_or_default(),
                    timed_out: v["timed_out"].as_bool().unwrap_or_default(),
                };
            }
        }
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        drop(self.requests.take());
        let _ = self.child.wait();
    }
}

/// The spawner process's loop (a no-op in a normal test run).
#[test]
fn cli_spawner() {
    use std::io::{BufRead, Write};
    if std::env::var_os(SPAWNER_ENV).is_none() {
        return;
    }
    sys::cap_address_space(CLI_ADDRESS_SPACE_CAP);
    let stdout = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let req: Value = serde_json::from_str(&line.expect("request")).expect("request is JSON");
        let timeout = Duration::from_millis(req["timeout_ms"].as_u64().expect("timeout_ms"));
        let run = run_vtower(&strs(&req["args"]), timeout);
        let reply = serde_json::json!({
            "code": run.code, "signal": run.signal, "stderr": run.stderr,
            "max_rss_kib": run.max_rss_kib, "timed_out": run.timed_out,
        });
        let mut out = stdout.lock();
        writeln!(out, "{REPLY}{reply}").expect("reply");
        out.flush().expect("reply flushed");
    }
}

// ---------------------------------------------------------------------------------------------
// Building the cases
// ---------------------------------------------------------------------------------------------

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|x| x.as_str().expect("string").to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The image bytes of a case (`file`, or `derive`d from a fixture), or its URI.
enum ImageInput {
    Bytes(Vec<u8>),
    Uri(String),
}

fn image_input(src: &Value) -> ImageInput {
    if let Some(f) = src["file"].as_str() {
        return ImageInput::Bytes(std::fs::read(corpus().join(f)).expect("corpus file"));
    }
    if let Some(d) = src.get("derive") {
        let mut b = std::fs::read(fixtures().join(d["base"].as_str().expect("base")))
            .expect("fixture image");
        if let Some(n) = d["truncate"].as_u64() {
            b.truncate(n as usize);
        }
        if let Some(f) = d["flip"].as_array() {
            let (pos, bit) = (f[0].as_u64().unwrap() as usize, f[1].as_u64().unwrap());
            b[pos] ^= 1 << bit;
        }
        return ImageInput::Bytes(b);
    }
    if let Some(u) = src["uri"].as_str() {
        return ImageInput::Uri(u.to_string());
    }
    let g = &src["uri_gen"];
    let prefix = g["prefix"].as_str().expect("prefix");
    let fill = g["fill"].as_str().expect("fill");
    let len = g["len"].as_u64().expect("len") as usize;
    let mut s = prefix.to_string();
    s.push_str(&fill.repeat((len - prefix.len()).div_ceil(fill.len())));
    ImageInput::Uri(s)
}

/// Copies the case's base model (a file or a directory) into `dir` and applies its edits;
/// returns the path to open.
fn materialize_model(model: &Value, dir: &Path) -> PathBuf {
    let base = fixtures().join(model["base"].as_str().expect("base"));
    std::fs::create_dir_all(dir).expect("case dir");
    let edits: Vec<&Value> = model["edits"].as_array().into_iter().flatten().collect();
    // Files no edit touches are symlinks to the fixture; edited ones are copies.
    let edited = |name: &std::ffi::OsStr| {
        edits.iter().any(|e| {
            e["file"]
                .as_str()
                .map_or(!base.is_dir(), |f| std::ffi::OsStr::new(f) == name)
        })
    };
    let place = |from: &Path, to: &Path| {
        if edited(to.file_name().expect("file name")) {
            std::fs::copy(from, to).map(drop)
        } else {
            std::os::unix::fs::symlink(from, to)
        }
        .expect("place fixture file");
    };
    let target = if base.is_dir() {
        for e in std::fs::read_dir(&base).expect("base dir") {
            let e = e.expect("entry");
            place(&e.path(), &dir.join(e.file_name()));
        }
        dir.to_path_buf()
    } else {
        let t = dir.join(base.file_name().expect("file name"));
        place(&base, &t);
        t
    };
    for edit in edits {
        let file = match edit["file"].as_str() {
            Some(f) => dir.join(f),
            None => target.clone(),
        };
        match edit["op"].as_str().expect("op") {
            "patch" => {
                let mut b = std::fs::read(&file).expect("read");
                let at = edit["at"].as_u64().expect("at") as usize;
                let bytes = hex(edit["hex"].as_str().expect("hex"));
                b[at..at + bytes.len()].copy_from_slice(&bytes);
                std::fs::write(&file, b).expect("write");
            }
            "truncate" => {
                let mut b = std::fs::read(&file).expect("read");
                b.truncate(edit["len"].as_u64().expect("len") as usize);
                std::fs::write(&file, b).expect("write");
            }
            "splice_head" => {
                let b = std::fs::read(&file).expect("read");
                let mut out = std::fs::read(corpus().join(edit["head"].as_str().expect("head")))
                    .expect("head");
                out.extend_from_slice(
                    &b[edit["keep_from"].as_u64().expect("keep_from") as usize..],
                );
                std::fs::write(&file, out).expect("write");
            }
            "replace" => {
                let _ = std::fs::remove_file(&file);
                std::fs::copy(corpus().join(edit["with"].as_str().expect("with")), &file)
                    .expect("replace");
            }
            "delete" => std::fs::remove_file(&file).expect("delete"),
            other => panic!("unknown edit op {other}"),
        }
    }
    target
}

// ---------------------------------------------------------------------------------------------
// Running the cases
// ---------------------------------------------------------------------------------------------

/// One command-line run and the library outcome it must agree with.
struct CliSpec {
    label: String,
    args: Vec<OsString>,
    /// The library's outcome for the same operation, or the manifest's explicit classes.
    want: Result<Outcome, Vec<String>>,
    timeout: Duration,
}

/// What the whole run found.
#[derive(Default)]
struct Report {
    /// Figures per case class.
    classes: BTreeMap<String, ClassStats>,
    /// Everything that broke a rule (the test fails when this is not empty).
    failures: Vec<String>,
    /// How each `known_failing` case still fails.
    known_failing: Vec<String>,
}

/// Figures for one case, then summed per class.
#[derive(Default)]
struct ClassStats {
    cases: usize,
    /// Library outcome class → operations that gave it.
    lib: BTreeMap<String, usize>,
    cli_runs: usize,
    /// `exit N` / `signal N` → runs.
    cli_exit: BTreeMap<String, usize>,
    max_rss_kib: u64,
    /// The run that peaked at `max_rss_kib`.
    max_rss_run: String,
    /// Summed wall time of the class's cases (library and command line).
    seconds: f64,
}

/// What every case shares: the four fixture models, the small image model cases encode, and
/// the scratch directory.
struct Env {
    models: Vec<Model>,
    tiny: PathBuf,
    scratch: PathBuf,
}

/// Checks one library outcome against the manifest's classes.
fn check_lib(
    report: &mut Vec<String>,
    stats: &mut ClassStats,
    id: &str,
    op: &str,
    expect: &[String],
    got: &Outcome,
) {
    *stats.lib.entry(got.class().to_string()).or_default() += 1;
    if verbose() {
        let root = match got {
            Outcome::Err { root, .. } => root.as_str(),
            Outcome::Panic(m) => m.as_str(),
            Outcome::Ok => "",
        };
        eprintln!("outcome {id} | {op} | {} | {root}", got.class());
    }
    match got {
        Outcome::Panic(m) => report.push(format!("{id}: library {op} PANICKED: {m}")),
        _ if !allowed(expect, got.class()) => report.push(format!(
            "{id}: library {op} gave {} ({}), the manifest allows {expect:?}",
            got.class(),
            match got {
                Outcome::Err { root, .. } => root.as_str(),
                _ => "",
            }
        )),
        _ => {}
    }
}

/// Runs one `vtower` command and checks its exit, its stderr and its peak RSS.
fn check_cli(
    spawner: &mut Spawner,
    failures: &mut Vec<String>,
    stats: &mut ClassStats,
    id: &str,
    spec: &CliSpec,
) {
    let run = spawner.run(&spec.args, spec.timeout);
    stats.cli_runs += 1;
    let exit = match (run.code, run.signal) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "?".into(),
    };
    *stats.cli_exit.entry(exit.clone()).or_default() += 1;
    if run.max_rss_kib > stats.max_rss_kib {
        stats.max_rss_kib = run.max_rss_kib;
        stats.max_rss_run = format!("{id} [{}]", spec.label);
    }
    let what = format!("{id}: vtower {}", spec.label);
    let lines: Vec<&str> = run.stderr.lines().collect();
    if run.timed_out {
        failures.push(format!(
            "{what}: HUNG (killed after {:?}, peak RSS {} MiB by then)",
            spec.timeout,
            run.max_rss_kib >> 10
        ));
        return;
    }
    if run.max_rss_kib > CLI_RSS_BUDGET_MB << 10 {
        failures.push(format!(
            "{what}: peak RSS {} MiB over the {CLI_RSS_BUDGET_MB} MiB budget",
            run.max_rss_kib >> 10
        ));
    }
    let want_ok = match &spec.want {
        Ok(o) => matches!(o, Outcome::Ok),
        Err(classes) => classes.iter().any(|c| c == "ok"),
    };
    match (run.code, want_ok) {
        (Some(0), true) => {}
        (Some(1), false) => {
            if lines.len() != 1 || !lines[0].starts_with("vtower: ") {
                failures.push(format!(
                    "{what}: exit 1 but stderr is not one `vtower: ` line: {:?}",
                    run.stderr
                ));
            } else if let Ok(Outcome::Err { root, .. }) = &spec.want {
                if !lines[0].contains(root.as_str()) {
                    failures.push(format!(
                        "{what}: stderr {:?} does not carry the library's error {root:?}",
                        lines[0]
                    ));
                }
            }
        }
        _ => failures.push(format!(
            "{what}: {exit} (expected {}), stderr {:?}",
            if want_ok { "exit 0" } else { "exit 1" },
            run.stderr
        )),
    }
}

/// The family an image case runs `prepare`, `encode` and the command line with: the case's
/// own `family`, else a rotation over the case index.
fn family_of(case: &Value, i: usize) -> usize {
    case["family"].as_str().map_or(i % FAMILIES.len(), |f| {
        FAMILIES.iter().position(|x| *x == f).expect("known family")
    })
}

/// Runs one case; returns its failures.
fn run_case(
    env: &Env,
    spawner: &mut Spawner,
    index: usize,
    case: &Value,
    stats: &mut ClassStats,
) -> Vec<String> {
    let id = case["id"].as_str().expect("id");
    let expect = |op: &str| strs(&case["expect"][op]);
    let mut failures = Vec::new();
    let dir = env.scratch.join(format!("c{index}"));
    let cli: Vec<&Value> = case["cli"].as_array().into_iter().flatten().collect();
    let mut specs = Vec::new();
    let arg = |s: &str| OsString::from(s);
    let out = dir.join("out.safetensors");
    let timeout = case["known_failing"]["cli_timeout_s"]
        .as_u64()
        .map_or(CLI_TIMEOUT, Duration::from_secs);

    if let Some(src) = case.get("source") {
        // An image: plan on every family, prepare (and encode, for committed files) on one.
        let input = image_input(src);
        let fam = family_of(case, index);
        let (model, model_path) = (
            &env.models[fam],
            fixtures().join("models").join(FAMILIES[fam]),
        );
        let committed = src.get("derive").is_none()
            && src.get("uri_gen").is_none()
            && case["lib_encode"] != false;
        let read = |m: &Model, op: &str| -> Outcome {
            guarded(|| match &input {
                ImageInput::Bytes(b) => run_image_op(m, op, ImageSource::Bytes(b)),
                ImageInput::Uri(u) => match read_image_arg(u) {
                    Err(e) => err(class_prep_open(&e), &e),
                    Ok(a) => run_image_op(m, op, a.source()),
                },
            })
        };
        let mut by_op = BTreeMap::new();
        for (f, m) in env.models.iter().enumerate() {
            let got = read(m, "plan");
            check_lib(
                &mut failures,
                stats,
                id,
                &format!("plan ({})", FAMILIES[f]),
                &expect("plan"),
                &got,
            );
            if f == fam {
                by_op.insert("plan", got);
            }
        }
        let prepared = read(model, "prepare");
        check_lib(
            &mut failures,
            stats,
            id,
            "prepare",
            &expect("prepare"),
            &prepared,
        );
        by_op.insert("prep", prepared);
        if committed {
            let encoded = read(model, "encode");
            check_lib(
                &mut failures,
                stats,
                id,
                "encode",
                &expect("prepare"),
                &encoded,
            );
            by_op.insert("encode", encoded);
        }
        if cli.is_empty() {
            return failures;
        }
        std::fs::create_dir_all(&dir).expect("case dir");
        let image_arg: OsString = match &input {
            ImageInput::Bytes(b) => {
                let p = dir.join("image");
                std::fs::write(&p, b).expect("image");
                p.into_os_string()
            }
            ImageInput::Uri(u) => OsString::from(u),
        };
        for c in cli {
            let cmd = c["cmd"].as_str().expect("cmd");
            let mut args = vec![
                arg(cmd),
                arg("--model"),
                model_path.clone().into_os_string(),
            ];
            match cmd {
                "plan" => args.push(image_arg.clone()),
                "prep" => args.extend([image_arg.clone(), arg("--out"), out.clone().into()]),
                "encode" => args.extend([
                    arg("--image"),
                    image_arg.clone(),
                    arg("--out"),
                    out.clone().into(),
                ]),
                other => panic!("{id}: unknown image command {other}"),
            }
            let extra = strs(&c["args"]);
            args.extend(extra.iter().map(|a| arg(a)));
            specs.push(CliSpec {
                label: format!(
                    "{cmd} {}{}",
                    FAMILIES[fam],
                    if extra.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", extra.join(" "))
                    }
                ),
                args,
                want: match c.get("expect") {
                    Some(e) => Err(strs(e)),
                    None => Ok(by_op[cmd].clone()),
                },
                timeout,
            });
        }
    } else if let Some(inputs) = case.get("inputs") {
        let model_path = fixtures().join(case["model"]["base"].as_str().expect("base"));
        let file = corpus().join(inputs["file"].as_str().expect("file"));
        let got = guarded(|| match Tower::open(&model_path, Device::Cpu) {
            Err(e) => err(class_tower(&e), &e),
            Ok(t) => match t.encode_prepared_file(&file) {
                Ok(_) => Outcome::Ok,
                Err(e) => err(class_tower(&e), &e),
            },
        });
        check_lib(
            &mut failures,
            stats,
            id,
            "encode_prepared_file",
            &expect("encode_inputs"),
            &got,
        );
        for c in cli {
            assert_eq!(c["cmd"], "encode-inputs", "{id}");
            specs.push(CliSpec {
                label: "encode --inputs".into(),
                args: vec![
                    arg("encode"),
                    arg("--model"),
                    model_path.clone().into(),
                    arg("--inputs"),
                    file.clone().into(),
                    arg("--out"),
                    out.clone().into(),
                ],
                want: Ok(got.clone()),
                timeout,
            });
        }
        std::fs::create_dir_all(&dir).expect("case dir");
    } else {
        // A model: one defect away from a fixture model.
        let path = materialize_model(&case["model"], &dir.join("model"));
        let tiny = std::fs::read(&env.tiny).expect("tiny image");
        let inspect = guarded(|| match WeightFile::open(&path) {
            Ok(f) => {
                let _ = inspect_json(&f).to_string();
                Outcome::Ok
            }
            Err(e) => err(class_facade(&e), &e),
        });
        check_lib(
            &mut failures,
            stats,
            id,
            "inspect",
            &expect("inspect"),
            &inspect,
        );
        let plan = guarded(|| match WeightFile::open(&path) {
            Err(e) => err(class_facade(&e), &e),
            Ok(f) => match preprocessor_for(&path, &f, PrepSettings::default()) {
                Err(e) => err(class_prep_open(&e), &e),
                Ok(p) => match p.plan(ImageSource::Bytes(&tiny)) {
                    Ok(_) => Outcome::Ok,
                    Err(e) => err(format!("prep:{}", variant(&e)), &e),
                },
            },
        });
        check_lib(&mut failures, stats, id, "plan", &expect("plan"), &plan);
        let skip_in_process = case["known_failing"]["in_process"] == "skip";
        let mut encode = Outcome::Ok;
        // A known hang or unbounded allocation runs only as a child (timeout, address-space cap).
        if !skip_in_process {
            let opened = guarded(
                || match Model::open(&path, Device::Cpu, model_settings(&path)) {
                    Ok(m) => {
                        encode = guarded(|| match m.encode(&[ImageSource::Bytes(&tiny)]) {
                            Ok(_) => Outcome::Ok,
                            Err(e) => err(class_model(&e), &e),
                        });
                        Outcome::Ok
                    }
                    Err(e) => {
                        let o = err(class_model(&e), &e);
                        encode = o.clone();
                        o
                    }
                },
            );
            if let Outcome::Panic(_) = opened {
                encode = opened.clone();
            }
            check_lib(&mut failures, stats, id, "open", &expect("open"), &opened);
            check_lib(
                &mut failures,
                stats,
                id,
                "encode",
                &expect("encode"),
                &encode,
            );
        }
        for c in cli {
            let cmd = c["cmd"].as_str().expect("cmd");
            let (args, want) = match cmd {
                "inspect" => (vec![arg("inspect"), path.clone().into()], inspect.clone()),
                "plan" => (
                    vec![
                        arg("plan"),
                        arg("--model"),
                        path.clone().into(),
                        env.tiny.clone().into(),
                    ],
                    plan.clone(),
                ),
                "encode" => (
                    vec![
                        arg("encode"),
                        arg("--model"),
                        path.clone().into(),
                        arg("--image"),
                        env.tiny.clone().into(),
                        arg("--out"),
                        out.clone().into(),
                    ],
                    encode.clone(),
                ),
                other => panic!("{id}: unknown model command {other}"),
            };
            specs.push(CliSpec {
                label: cmd.to_string(),
                args,
                want: if skip_in_process {
                    Err(expect(cmd))
                } else {
                    Ok(want)
                },
                timeout,
            });
        }
    }
    for spec in &specs {
        check_cli(spawner, &mut failures, stats, id, spec);
    }
    let _ = std::fs::remove_dir_all(&dir);
    failures
}

/// A GGUF mmproj carries no processor config, so it would encode at the processor default of
/// 280 soft tokens (~5 s of host arithmetic per image in a debug build): the library encodes
/// GGUF cases at 70, as the HF fixture's own config says. Everything else: the defaults (what
/// `vtower` uses).
fn model_settings(path: &Path) -> PrepSettings {
    PrepSettings {
        max_soft_tokens: (path.extension() == Some(std::ffi::OsStr::new("gguf"))).then_some(70),
        ..PrepSettings::default()
    }
}

fn run_image_op(m: &Model, op: &str, src: ImageSource<'_>) -> Outcome {
    match op {
        "plan" => match m.plan(src) {
            Ok(_) => Outcome::Ok,
            Err(e) => err(class_model(&e), &e),
        },
        "prepare" => match m.preprocessor().prepare(src) {
            Ok(_) => Outcome::Ok,
            Err(e) => err(format!("prep:{}", variant(&e)), &e),
        },
        "encode" => match m.encode(&[src]) {
            Ok(_) => Outcome::Ok,
            Err(e) => err(class_model(&e), &e),
        },
        other => panic!("unknown image op {other}"),
    }
}

/// `VT_ADVERSARIAL_VERBOSE=1` (with `--nocapture`): every library outcome with its message,
/// and every case slower than half a second.
fn verbose() -> bool {
    std::env::var_os("VT_ADVERSARIAL_VERBOSE").is_some()
}

/// Adds one case's outcome to the report.
fn record(r: &mut Report, case: &Value, stats: ClassStats, failures: Vec<String>) {
    let id = case["id"].as_str().expect("id");
    if verbose() && stats.seconds > 0.5 {
        eprintln!("slow case {:.2}s: {id}", stats.seconds);
    }
    let known = case.get("known_failing");
    match known {
        Some(k) if !failures.is_empty() => {
            let shown: Vec<String> = failures
                .iter()
                .map(|f| f.chars().take(240).collect())
                .collect();
            r.known_failing.push(format!(
                "{id} ({}: {}): {}",
                k["kind"].as_str().unwrap_or_default(),
                k["note"].as_str().unwrap_or_default(),
                shown.join(" | ")
            ));
        }
        Some(_) => r.failures.push(format!(
            "{id}: marked known_failing but passes now: remove the mark in generate.py"
        )),
        None => r.failures.extend(failures),
    }
    let c = r
        .classes
        .entry(case["class"].as_str().expect("class").to_string())
        .or_default();
    c.cases += 1;
    for (k, v) in stats.lib {
        *c.lib.entry(k).or_default() += v;
    }
    for (k, v) in stats.cli_exit {
        *c.cli_exit.entry(k).or_default() += v;
    }
    c.cli_runs += stats.cli_runs;
    c.seconds += stats.seconds;
    // Known-failing runs (killed hangs) carry their own figures in their report line.
    if known.is_none() && stats.max_rss_kib > c.max_rss_kib {
        c.max_rss_kib = stats.max_rss_kib;
        c.max_rss_run = stats.max_rss_run;
    }
}

#[test]
#[cfg_attr(
    not(all(target_os = "linux", target_pointer_width = "64")),
    ignore = "peak RSS through wait4: 64-bit Linux only"
)]
fn adversarial_corpus_through_library_and_cli() {
    let start = Instant::now();
    let text = std::fs::read_to_string(corpus().join("manifest.json")).expect("manifest.json");
    let manifest: Value = serde_json::from_str(&text).expect("manifest is JSON");
    let cases = manifest["cases"].as_array().expect("cases");
    let models = FAMILIES
        .iter()
        .map(|f| {
            Model::open(
                &fixtures().join("models").join(f),
                Device::Cpu,
                PrepSettings::default(),
            )
            .expect("fixture model opens")
        })
        .collect();
    let scratch =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("adversarial-{}", std::process::id()));
    let env = Env {
        models,
        tiny: fixtures().join("images/tiny_20x15.png"),
        scratch: scratch.clone(),
    };
    let next = AtomicUsize::new(0);
    let report = Mutex::new(Report::default());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let mut spawner = Spawner::start();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(case) = cases.get(i) else { break };
                    let mut stats = ClassStats::default();
                    let t = Instant::now();
                    let failures = run_case(&env, &mut spawner, i, case, &mut stats);
                    stats.seconds = t.elapsed().as_secs_f64();
                    record(&mut report.lock().expect("report"), case, stats, failures);
                }
            });
        }
    });
    let _ = std::fs::remove_dir_all(&scratch);
    let r = report.into_inner().expect("report");
    let mut total = (0, 0, 0u64);
    eprintln!(
        "{:<18} {:>5} {:>8} {:>9} {:>7}  library outcomes; CLI exits; peak-RSS run",
        "class", "cases", "CLI runs", "max RSS", "time"
    );
    for (class, c) in &r.classes {
        total.0 += c.cases;
        total.1 += c.cli_runs;
        total.2 = total.2.max(c.max_rss_kib);
        eprintln!(
            "{class:<18} {:>5} {:>8} {:>5.1} MiB {:>6.1}s  {:?}; {:?}; {}",
            c.cases,
            c.cli_runs,
            c.max_rss_kib as f64 / 1024.0,
            c.seconds,
            c.lib,
            c.cli_exit,
            c.max_rss_run
        );
    }
    eprintln!(
        "{} cases, {} CLI runs, max peak RSS {:.1} MiB outside known-failing cases \
         (budget {CLI_RSS_BUDGET_MB} MiB), {:.1} s with {workers} workers",
        total.0,
        total.1,
        total.2 as f64 / 1024.0,
        start.elapsed().as_secs_f64()
    );
    for k in &r.known_failing {
        eprintln!("KNOWN FAILING (reported bug, kept in the corpus): {k}");
    }
    assert!(
        r.failures.is_empty(),
        "{} failures:\n{}",
        r.failures.len(),
        r.failures.join("\n")
    );
    assert_eq!(total.0, cases.len());
}

/// Every file under the corpus's generated folders is used by some case (no stale file).
#[test]
fn every_corpus_file_is_in_the_manifest() {
    let text = std::fs::read_to_string(corpus().join("manifest.json")).expect("manifest.json");
    let mut used = std::collections::BTreeSet::new();
    fn collect(v: &Value, used: &mut std::collections::BTreeSet<String>) {
        match v {
            Value::String(s) if s.contains('/') => {
                used.insert(s.clone());
            }
            Value::Array(a) => a.iter().for_each(|x| collect(x, used)),
            Value::Object(o) => o.values().for_each(|x| collect(x, used)),
            _ => {}
        }
    }
    collect(&serde_json::from_str(&text).expect("JSON"), &mut used);
    let mut stale = Vec::new();
    for d in ["images", "weights", "inputs"] {
        for e in std::fs::read_dir(corpus().join(d)).expect("corpus dir") {
            let rel = format!("{d}/{}", e.expect("entry").file_name().to_string_lossy());
            if !used.contains(&rel) {
                stale.push(rel);
            }
        }
    }
    assert!(stale.is_empty(), "files no case uses: {stale:?}");
}

/// Image expectations are exact: an image case may not accept "any error" (`prep:*`), nor both
/// success and an error, unless it says why both are right (`why`, written beside the case in
/// generate.py). The outcome of a damaged image is determined (by Pillow, upstream's decoder,
/// and by the format's header): a manifest that accepts everything checks nothing.
#[test]
fn image_expectations_are_exact_or_say_why() {
    let text = std::fs::read_to_string(corpus().join("manifest.json")).expect("manifest.json");
    let manifest: Value = serde_json::from_str(&text).expect("manifest is JSON");
    let mut loose = Vec::new();
    let mut images = 0;
    for case in manifest["cases"].as_array().expect("cases") {
        if case.get("source").is_none() {
            continue;
        }
        images += 1;
        let has_why = case["why"].as_str().is_some_and(|w| !w.is_empty());
        for (op, expect) in case["expect"].as_object().expect("expect") {
            let e = strs(expect);
            let wildcard = e.iter().any(|c| c.ends_with(":*"));
            let ok_or_error = e.len() > 1 && e.iter().any(|c| c == "ok");
            if wildcard || (ok_or_error && !has_why) {
                loose.push(format!(
                    "{} {op}: {e:?}",
                    case["id"].as_str().unwrap_or("?")
                ));
            }
        }
    }
    assert!(images > 700, "only {images} image cases");
    assert!(
        loose.is_empty(),
        "{} image expectations accept more than their outcome:\n{}",
        loose.len(),
        loose
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
