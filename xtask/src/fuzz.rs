//! `cargo xtask fuzz`: every cargo-fuzz target of `fuzz/` for a bounded time on top of the
//! committed corpus, as CI runs it on each landing (batch fuzzing, as ClusterFuzzLite runs it on
//! pull requests). `cargo xtask test` runs it as its last step; `--no-fuzz` skips it.
//!
//! 1. Tools: cargo-fuzz [`CARGO_FUZZ_VERSION`] is installed under `target/fuzz-tools`
//!    (`cargo install --locked --root`; skipped when that binary is already there), and the
//!    nightly toolchain that builds the targets (ASan and sancov need `-Z` flags) must be one
//!    rustup already has (`VT_FUZZ_TOOLCHAIN` names another): CI reaches crates.io, not
//!    rustup's servers.
//! 2. One build of every target (`cargo fuzz build -a`: release, debug assertions, ASan) into
//!    `target/fuzz/build`. Where `clang-19` is installed, libjpeg-turbo's C gets ASan and
//!    libFuzzer's coverage too; otherwise it builds uninstrumented (said on stderr).
//! 3. Each target runs for `--seconds` (libFuzzer's `-max_total_time`, which counts from the
//!    process's start, so the replay of the corpus is inside it unless the replay alone takes
//!    longer), `--jobs` targets at a time, on top of its corpus: the seeds `fuzz/seeds.py`
//!    derives from the committed `fixtures/` (written to `target/fuzz/seeds/<target>/` in 1–10 s
//!    as the machine is loaded; 121 MB, mostly fixture models with one defect: not committed
//!    twice) and the committed `fuzz/corpus/<target>/`, the inputs the fuzzers found that add coverage
//!    beyond the seeds. New inputs go to `target/fuzz/new/<target>/`, never into the committed
//!    tree. The log of each run is `target/fuzz/logs/<target>.log`.
//! 4. One table: wall and CPU seconds, executions, coverage, corpus size, new inputs, crashes
//!    (also written to `target/fuzz/summary.md`). A crash, leak, timeout or out-of-memory fails
//!    the command with the reproducer's path (`fuzz/artifacts/<target>/…`) and the command that
//!    replays it; the other targets still run first.
//!
//! `--merge` re-minimises the committed corpus with the new inputs: libFuzzer's `-merge=1` into
//! a copy of the seeds keeps, of the committed and new inputs, a minimal set that adds every
//! feature they add beyond the seeds; that set (named by SHA-1, as libFuzzer names its inputs)
//! replaces `fuzz/corpus/<target>/`, but for inputs over [`COMMIT_MAX_BYTES`], which stay in
//! `target/fuzz/new/<target>/`. Commit `fuzz/corpus` after it.
use anyhow::{bail, Context, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use crate::workspace_root;

/// The cargo-fuzz release the step installs (the one docs/RELIABILITY.md's campaigns used).
pub const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Seconds per target when `--seconds` is not given: 11 targets × 60 s on CI's 2 cores, two at a
/// time, is 5.5 minutes of wall time (11 CPU-minutes) plus the build; see docs/RELIABILITY.md.
pub const DEFAULT_SECONDS: u64 = 60;

/// The largest input `--merge` commits. The rest of what adds coverage is mostly whole model
/// files (0.3–1.1 MB) with a few bytes changed, mutants of the seeds every run regenerates: the
/// first merge of 2026-12-06 kept 218 of them, 73 of its 83 MB. They stay in
/// `target/fuzz/new/<target>/`, where local runs still read them. 16 KiB, not more: the repository
/// travels whole to the GPU machine, whose carry limit is 64 MiB (a 64 KiB cap made it 64.97 MiB).
const COMMIT_MAX_BYTES: u64 = 16 << 10;

/// libFuzzer's RSS cap per process (MiB): over it is an out-of-memory finding. The campaigns in
/// docs/RELIABILITY.md peaked at 400–600 MB.
const RSS_LIMIT_MB: u64 = 2048;

/// libFuzzer's per-input time limit (s): over it is a timeout finding. The slowest input seen in
/// the campaigns took 12 s under ASan; ten times that leaves room for a loaded CI machine.
const UNIT_TIMEOUT_S: u64 = 120;

const USAGE: &str = "usage: cargo xtask fuzz [--seconds N] [--target T]... [--jobs J]
                        [--merge] [--reproduce FILE] [-- LIBFUZZER_FLAGS...]

  --seconds N       libFuzzer's -max_total_time per target (default 60)
  --target T        only this target (repeat, or a comma list); default every fuzz/fuzz_targets/*.rs
  --jobs J          targets fuzzed at once (default: the CPU count, at most the targets)
  --merge           fold target/fuzz/new/<T>/ into the committed corpus fuzz/corpus/<T>/
                    (libFuzzer -merge=1: a minimal set adding the union's coverage to the
                    seeds of fixtures/); no fuzzing
  --reproduce FILE  run one input through the target (--target T) and exit with its status
  -- FLAGS          more libFuzzer flags for every run (after the defaults, so they win)

Tools go to target/fuzz-tools (cargo-fuzz), builds to target/fuzz/build; the nightly
toolchain comes from rustup (VT_FUZZ_TOOLCHAIN names another).";

/// Progress on stdout (`crate::progress`), tagged `fuzz`.
macro_rules! say {
    ($($arg:tt)*) => {
        crate::progress::say("fuzz", format_args!($($arg)*))
    };
}

struct Args {
    seconds: u64,
    targets: Vec<String>,
    jobs: Option<usize>,
    merge: bool,
    reproduce: Option<PathBuf>,
    extra: Vec<String>,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args {
        seconds: DEFAULT_SECONDS,
        targets: Vec::new(),
        jobs: None,
        merge: false,
        reproduce: None,
        extra: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .with_context(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--seconds" => a.seconds = value()?.parse().context("--seconds takes a number")?,
            "--target" => a.targets.extend(value()?.split(',').map(str::to_owned)),
            "--jobs" => a.jobs = Some(value()?.parse().context("--jobs takes a number")?),
            "--merge" => a.merge = true,
            "--reproduce" => a.reproduce = Some(PathBuf::from(value()?)),
            "--" => {
                a.extra = it.by_ref().cloned().collect();
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}\n{USAGE}"),
        }
    }
    if a.seconds == 0 || a.jobs == Some(0) {
        bail!("--seconds and --jobs must be positive\n{USAGE}");
    }
    if a.reproduce.is_some() && a.targets.len() != 1 {
        bail!("--reproduce FILE needs exactly one --target\n{USAGE}");
    }
    Ok(a)
}

/// Where everything lives.
struct Paths {
    root: PathBuf,
    /// `target/fuzz-tools`: `cargo install --root`.
    tools: PathBuf,
    /// `target/fuzz`: build, new inputs, logs.
    work: PathBuf,
    /// `fuzz/corpus`: the committed corpus, one folder per target.
    corpus: PathBuf,
    /// `fuzz/artifacts`: where cargo-fuzz tells libFuzzer to write findings.
    artifacts: PathBuf,
}

impl Paths {
    fn new() -> Paths {
        let root = workspace_root();
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        Paths {
            tools: target.join("fuzz-tools"),
            work: target.join("fuzz"),
            corpus: root.join("fuzz/corpus"),
            artifacts: root.join("fuzz/artifacts"),
            root,
        }
    }

    fn build(&self) -> PathBuf {
        self.work.join("build")
    }

    fn new_inputs(&self, target: &str) -> PathBuf {
        self.work.join("new").join(target)
    }

    fn seeds(&self, target: &str) -> PathBuf {
        self.work.join("seeds").join(target)
    }

    fn log(&self, target: &str) -> PathBuf {
        self.work.join("logs").join(format!("{target}.log"))
    }

    fn cargo_fuzz(&self) -> PathBuf {
        self.tools.join("bin/cargo-fuzz")
    }
}

/// `-max_len` per target (0: libFuzzer's default, the largest input of the corpus): large enough
/// to take each target's largest seed whole (fuzz/seeds.py).
fn max_len(target: &str) -> u64 {
    match target {
        "prep" => 65_536,        // the selector byte + images up to 64 KiB
        "inputs" => 400_000,     // prepared inputs up to 350 KB
        "tower_st" => 1_100_000, // the 1.08 MB step3p7 model.safetensors
        _ => 0,
    }
}

/// libFuzzer's flags for every run of `target`, before the caller's.
fn libfuzzer_flags(target: &str) -> Vec<String> {
    vec![
        format!("-rss_limit_mb={RSS_LIMIT_MB}"),
        format!("-timeout={UNIT_TIMEOUT_S}"),
        format!("-max_len={}", max_len(target)),
    ]
}

/// Entry point of `cargo xtask fuzz`.
pub fn run(args: &[String]) -> Result<()> {
    crate::progress::started();
    let a = parse(args)?;
    let p = Paths::new();
    let all = list_targets(&p.root)?;
    let targets = if a.targets.is_empty() {
        all
    } else {
        for t in &a.targets {
            if !all.contains(t) {
                bail!(
                    "no fuzz target `{t}` (fuzz/fuzz_targets has {})",
                    all.join(", ")
                );
            }
        }
        a.targets.clone()
    };

    let started = Instant::now();
    let toolchain = Toolchain::find()?;
    let installed = ensure_cargo_fuzz(&p)?;
    let t = Instant::now();
    build(&p, &toolchain, &targets)?;
    let build_s = t.elapsed().as_secs_f64();

    if let (Some(file), [target]) = (&a.reproduce, targets.as_slice()) {
        return reproduce(&p, &toolchain, target, file);
    }
    write_seeds(&p)?;
    if a.merge {
        return merge(&p, &toolchain, &targets);
    }

    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .min(targets.len());
    say!(
        "{} targets, {} s each, {jobs} at a time; corpus: seeds + fuzz/corpus/<T>; new inputs {}",
        targets.len(),
        a.seconds,
        p.work.join("new/<T>").display()
    );
    let t = Instant::now();
    let queue = Mutex::new(targets.iter().collect::<std::collections::VecDeque<_>>());
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let next = queue.lock().map(|mut q| q.pop_front());
                let Ok(Some(target)) = next else { break };
                let r = fuzz_one(&p, &toolchain, target, a.seconds, &a.extra);
                match &r {
                    Ok(o) => say!("{target}: {}", o.verdict()),
                    Err(e) => say!("{target}: could not run: {e:#}"),
                }
                if let Ok(mut v) = results.lock() {
                    v.push((target.clone(), r));
                }
            });
        }
    });
    let fuzz_s = t.elapsed().as_secs_f64();
    let mut results = results.into_inner().unwrap_or_default();
    results.sort_by_key(|(t, _)| targets.iter().position(|x| x == t));

    let mut table = String::new();
    let _ = writeln!(
        table,
        "| target | seconds | CPU s | executions | cov | corpus (seeds + committed + new) | new inputs | crashes |"
    );
    let _ = writeln!(table, "|---|---|---|---|---|---|---|---|");
    let mut failures = Vec::new();
    for (target, r) in &results {
        match r {
            Ok(o) => {
                let _ = writeln!(
                    table,
                    "| `{target}` | {:.0} | {:.0} | {} | {} | {} + {} + {} | {} | {} |",
                    o.wall_s,
                    o.cpu_s,
                    opt(o.execs),
                    opt(o.cov),
                    o.seeds,
                    o.committed,
                    o.new_total,
                    o.new_inputs,
                    o.crashes()
                );
                if !o.status.success() {
                    failures.push(o);
                }
            }
            Err(e) => {
                let _ = writeln!(
                    table,
                    "| `{target}` | – | – | – | – | – | – | error: {e:#} |"
                );
            }
        }
    }
    let errors = results.iter().filter(|(_, r)| r.is_err()).count();
    let header = format!(
        "cargo-fuzz {CARGO_FUZZ_VERSION} ({}), {} targets × {} s, {jobs} at a time: install {}, build {build_s:.0} s, fuzz {fuzz_s:.0} s, total {:.0} s",
        toolchain.version,
        targets.len(),
        a.seconds,
        match installed {
            Some(s) => format!("{s:.0} s"),
            None => "cached".into(),
        },
        started.elapsed().as_secs_f64()
    );
    println!("\n{header}\n\n{table}");
    std::fs::create_dir_all(&p.work)?;
    std::fs::write(p.work.join("summary.md"), format!("{header}\n\n{table}"))?;

    let new: usize = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .map(|o| o.new_total)
        .sum();
    if new > 0 {
        say!(
            "{new} inputs under {} add coverage to the committed corpus; to keep them: \
             cargo xtask fuzz --merge (a minimal merge into fuzz/corpus/<T>/), then commit fuzz/corpus",
            p.work.join("new").display()
        );
    }
    for o in &failures {
        o.report(&p);
    }
    if !failures.is_empty() || errors > 0 {
        bail!(
            "fuzzing failed: {} target(s) found a crash, {} could not run",
            failures.len(),
            errors
        );
    }
    Ok(())
}

fn opt(v: Option<u64>) -> String {
    v.map_or("?".into(), |v| v.to_string())
}

/// The names of `fuzz/fuzz_targets/*.rs`, sorted.
fn list_targets(root: &Path) -> Result<Vec<String>> {
    let dir = root.join("fuzz/fuzz_targets");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = e?.path();
        if path.extension().is_some_and(|x| x == "rs") {
            if let Some(stem) = path.file_stem().and_then(|s| s.to_str()) {
                out.push(stem.to_owned());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The toolchain `cargo fuzz` builds with.
struct Toolchain {
    name: String,
    /// Its `bin` folder, put first on `PATH` so that cargo-fuzz's `cargo` and `rustc` are its.
    bin: PathBuf,
    version: String,
}

impl Toolchain {
    fn find() -> Result<Toolchain> {
        let name = std::env::var("VT_FUZZ_TOOLCHAIN").unwrap_or_else(|_| "nightly".into());
        let out = Command::new("rustup")
            .args(["which", "--toolchain", &name, "rustc"])
            .output()
            .context("running rustup (cargo fuzz needs a rustup-managed nightly toolchain)")?;
        let rustc = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if !out.status.success() || !rustc.exists() {
            let list = Command::new("rustup")
                .args(["toolchain", "list"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).replace('\n', "; "))
                .unwrap_or_default();
            bail!(
                "cargo fuzz needs the `{name}` toolchain (ASan and sancov take -Z flags) and \
                 rustup has none ({}; installed: {list}); install it with \
                 `rustup toolchain install {name} --profile minimal`, or name another with \
                 VT_FUZZ_TOOLCHAIN",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let bin = rustc
            .parent()
            .map(Path::to_path_buf)
            .context("rustc has no folder")?;
        let version = Command::new(&rustc)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default();
        Ok(Toolchain { name, bin, version })
    }
}

/// Installs cargo-fuzz [`CARGO_FUZZ_VERSION`] under `target/fuzz-tools` unless it is there;
/// returns the seconds the install took (`None`: it was there).
fn ensure_cargo_fuzz(p: &Paths) -> Result<Option<f64>> {
    let bin = p.cargo_fuzz();
    let have = Command::new(&bin)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    if have == format!("cargo-fuzz {CARGO_FUZZ_VERSION}") {
        return Ok(None);
    }
    say!(
        "cargo install cargo-fuzz --locked --version {CARGO_FUZZ_VERSION} --root {}",
        p.tools.display()
    );
    let t = Instant::now();
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["install", "cargo-fuzz", "--locked", "--force", "--version"])
        .arg(CARGO_FUZZ_VERSION)
        .arg("--root")
        .arg(&p.tools)
        // its build goes to a temporary folder, not into the workspace's target directory
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .context("running cargo install")?;
    if !status.success() {
        bail!("cargo install cargo-fuzz {CARGO_FUZZ_VERSION} failed ({status})");
    }
    Ok(Some(t.elapsed().as_secs_f64()))
}

/// `cargo fuzz <sub> -a --target-dir target/fuzz/build` on the fuzz toolchain.
fn cargo_fuzz(p: &Paths, tc: &Toolchain, sub: &str) -> Command {
    let mut cmd = Command::new(p.cargo_fuzz());
    cmd.current_dir(&p.root)
        .args(["fuzz", sub, "-a", "--target-dir"])
        .arg(p.build())
        .env("RUSTUP_TOOLCHAIN", &tc.name)
        .env("PATH", path_with(&tc.bin))
        // the outer `cargo xtask`'s toolchain must not leak into the fuzz build
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC")
        .env_remove("CARGO_TARGET_DIR");
    if which("clang-19") {
        cmd.env("CC_x86_64_unknown_linux_gnu", "clang-19").env(
            "CFLAGS_x86_64_unknown_linux_gnu",
            "-fsanitize=address -fsanitize-coverage=inline-8bit-counters,pc-table,trace-cmp",
        );
    }
    cmd
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(program).is_file()))
}

fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut parts = vec![dir.to_path_buf()];
    if let Some(p) = std::env::var_os("PATH") {
        parts.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(parts).unwrap_or_default()
}

/// One `cargo fuzz build` of `targets` (all of them in one cargo invocation when all are asked).
fn build(p: &Paths, tc: &Toolchain, targets: &[String]) -> Result<()> {
    if !which("clang-19") {
        eprintln!(
            "fuzz: no clang-19: libjpeg-turbo's C is built without ASan or coverage (the Rust code has both)"
        );
    }
    let all = list_targets(&p.root)?;
    let mut cmd = cargo_fuzz(p, tc, "build");
    if targets.len() == 1 && all.len() > 1 {
        cmd.arg(&targets[0]);
    }
    say!("cargo fuzz build -a ({})", tc.version);
    let status = cmd.status().context("running cargo fuzz build")?;
    if !status.success() {
        bail!("cargo fuzz build failed ({status})");
    }
    Ok(())
}

/// Files directly in `dir` (0 when it does not exist).
fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .count()
    })
}

/// What one target's run gave.
struct Outcome {
    target: String,
    status: ExitStatus,
    wall_s: f64,
    cpu_s: f64,
    execs: Option<u64>,
    cov: Option<u64>,
    /// Files in `target/fuzz/seeds/<T>`.
    seeds: usize,
    /// Files in `fuzz/corpus/<T>`.
    committed: usize,
    /// Files in `target/fuzz/new/<T>` after the run (earlier runs' included).
    new_total: usize,
    /// Files this run added there.
    new_inputs: usize,
    /// Findings this run wrote to `fuzz/artifacts/<T>` (slow-unit reports excluded).
    artifacts: Vec<PathBuf>,
    log: PathBuf,
}

impl Outcome {
    fn crashes(&self) -> String {
        if self.status.success() {
            return "0".into();
        }
        let kinds: Vec<&str> = self
            .artifacts
            .iter()
            .filter_map(|a| a.file_name()?.to_str()?.split('-').next())
            .collect();
        if kinds.is_empty() {
            format!("failed ({})", self.status)
        } else {
            format!("{} ({})", kinds.len(), kinds.join(", "))
        }
    }

    fn verdict(&self) -> String {
        format!(
            "{} after {:.0} s, {} executions, {} new inputs{}",
            if self.status.success() {
                "ok"
            } else {
                "FAILED"
            },
            self.wall_s,
            opt(self.execs),
            self.new_inputs,
            if self.status.success() {
                String::new()
            } else {
                format!(" ({}; log {})", self.status, self.log.display())
            }
        )
    }

    /// The failure's log tail and its reproducers, on stderr.
    fn report(&self, p: &Paths) {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        eprintln!(
            "\n==== fuzz target `{}` failed ({}): from {} ====",
            self.target,
            self.status,
            self.log.display()
        );
        // The finding (a panic's message, or the sanitizer's or libFuzzer's report), then
        // libFuzzer's summary and where it wrote the input.
        let first = lines.iter().position(|l| {
            l.contains("panicked at")
                || l.contains("ERROR: AddressSanitizer")
                || l.contains("ERROR: libFuzzer")
        });
        if let Some(i) = first {
            for l in &lines[i..lines.len().min(i + 12)] {
                eprintln!("    {l}");
            }
            eprintln!("    …");
        }
        for l in lines
            .iter()
            .filter(|l| l.starts_with("SUMMARY:") || l.contains("Test unit written to"))
        {
            eprintln!("    {l}");
        }
        let mut reproducers: Vec<PathBuf> = self.artifacts.clone();
        if reproducers.is_empty() {
            // libFuzzer's own line, should the file be elsewhere
            reproducers = lines
                .iter()
                .filter_map(|l| l.split("Test unit written to ").nth(1))
                .map(|s| PathBuf::from(s.trim()))
                .collect();
        }
        for r in &reproducers {
            let shown = r.strip_prefix(&p.root).unwrap_or(r);
            eprintln!("fuzz: reproducer: {}", shown.display());
            eprintln!(
                "fuzz: replay it:  cargo xtask fuzz --target {} --reproduce {}",
                self.target,
                shown.display()
            );
        }
        if reproducers.is_empty() {
            eprintln!("fuzz: no reproducer was written (see the log)");
        }
    }
}

/// Runs one target for `seconds` on top of its committed corpus.
fn fuzz_one(
    p: &Paths,
    tc: &Toolchain,
    target: &str,
    seconds: u64,
    extra: &[String],
) -> Result<Outcome> {
    let corpus = p.corpus.join(target);
    let new = p.new_inputs(target);
    let log_path = p.log(target);
    std::fs::create_dir_all(&corpus)?;
    std::fs::create_dir_all(&new)?;
    if let Some(dir) = log_path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let new_before = count_files(&new);
    let since = SystemTime::now();
    say!("{target}: started");
    // The first folder is libFuzzer's output corpus: new inputs go there, never into the
    // committed tree; all three are read at the start.
    let seeds = p.seeds(target);
    let mut cmd = cargo_fuzz(p, tc, "run");
    cmd.arg(target)
        .arg(&new)
        .arg(&corpus)
        .arg(&seeds)
        .arg("--")
        .args(libfuzzer_flags(target))
        .arg(format!("-max_total_time={seconds}"))
        .arg("-print_final_stats=1")
        .args(extra)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let t = Instant::now();
    let mut child = cmd.spawn().context("starting cargo fuzz run")?;
    let (status, cpu_s) = wait_with_rusage(&mut child)?;
    let wall_s = t.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let new_total = count_files(&new);
    Ok(Outcome {
        target: target.to_owned(),
        status,
        wall_s,
        cpu_s,
        execs: stat(&text, "number_of_executed_units"),
        cov: last_cov(&text),
        seeds: count_files(&seeds),
        committed: count_files(&corpus),
        new_total,
        new_inputs: new_total.saturating_sub(new_before),
        artifacts: artifacts_since(&p.artifacts.join(target), since),
        log: log_path,
    })
}

/// Waits for `child` and returns its status with the CPU time (user + system) of it and of every
/// process it waited for (cargo-fuzz → cargo → the fuzz binary).
fn wait_with_rusage(child: &mut std::process::Child) -> Result<(ExitStatus, f64)> {
    use std::os::unix::process::ExitStatusExt;
    let pid = libc::pid_t::try_from(child.id()).context("child pid out of range")?;
    let mut status: libc::c_int = 0;
    // SAFETY: `rusage` is plain old data; all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `pid` is our child, not yet waited for (std's `Child` has not reaped it and
        // never will after this); `status` and `usage` are valid, exclusive out-pointers.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err).context("waiting for cargo fuzz run");
        }
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Ok((
        ExitStatus::from_raw(status),
        secs(usage.ru_utime) + secs(usage.ru_stime),
    ))
}

/// libFuzzer's `-print_final_stats` value `stat::<key>`.
fn stat(log: &str, key: &str) -> Option<u64> {
    let prefix = format!("stat::{key}:");
    log.lines()
        .rev()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
}

/// The last `cov: N` of libFuzzer's status lines.
fn last_cov(log: &str) -> Option<u64> {
    log.lines().rev().find_map(|l| {
        let rest = l.split(" cov: ").nth(1)?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Findings written to `dir` since `since` (libFuzzer's `slow-unit-` reports are not findings).
fn artifacts_since(dir: &Path, since: SystemTime) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|m| m >= since)
        })
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with("slow-unit-"))
        })
        .collect();
    out.sort();
    out
}

/// `--reproduce FILE`: the one input through the target, output on the terminal.
fn reproduce(p: &Paths, tc: &Toolchain, target: &str, file: &Path) -> Result<()> {
    let status = cargo_fuzz(p, tc, "run")
        .arg(target)
        .arg(file)
        .arg("--")
        .args(libfuzzer_flags(target))
        .status()
        .context("running cargo fuzz run")?;
    if !status.success() {
        bail!("{target} fails on {} ({status})", file.display());
    }
    say!("{target} passes {}", file.display());
    Ok(())
}

/// The seeds of every target, from `fixtures/` (`python3 fuzz/seeds.py target/fuzz/seeds`).
fn write_seeds(p: &Paths) -> Result<()> {
    let dir = p.work.join("seeds");
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new("python3")
        .arg(p.root.join("fuzz/seeds.py"))
        .arg(&dir)
        .output()
        .context("running python3 fuzz/seeds.py")?;
    if !out.status.success() {
        bail!(
            "fuzz/seeds.py failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    say!("seeds from fixtures/ in {}", dir.display());
    Ok(())
}

/// `--merge`: each target's committed corpus re-minimised with its new inputs, relative to the
/// seeds.
fn merge(p: &Paths, tc: &Toolchain, targets: &[String]) -> Result<()> {
    let mut table = String::from(
        "| target | committed before | new | seeds | committed after | over the size cap (kept in new) |\n|---|---|---|---|---|---|\n",
    );
    for target in targets {
        let corpus = p.corpus.join(target);
        let new = p.new_inputs(target);
        let seeds = p.seeds(target);
        // libFuzzer merges into the first folder the inputs of the others that add features it
        // lacks; with the seeds there first, what it adds is what the seeds do not cover.
        let base = p.work.join("merge").join(target);
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base)?;
        std::fs::create_dir_all(&corpus)?;
        let mut seed_names = std::collections::HashSet::new();
        for e in std::fs::read_dir(&seeds).with_context(|| format!("{}", seeds.display()))? {
            let e = e?;
            std::fs::copy(e.path(), base.join(e.file_name()))?;
            seed_names.insert(e.file_name());
        }
        let (before, n_new) = (count_files(&corpus), count_files(&new));
        let mut cmd = cargo_fuzz(p, tc, "run");
        cmd.arg(target).arg(&base).arg(&corpus);
        if n_new > 0 {
            cmd.arg(&new);
        }
        cmd.arg("--")
            .args(libfuzzer_flags(target))
            .arg("-merge=1")
            .stdin(Stdio::null());
        say!(
            "{target}: merging {before} committed and {n_new} new inputs over {} seeds",
            seed_names.len()
        );
        let status = cmd.status().context("running cargo fuzz run -merge=1")?;
        if !status.success() {
            bail!("{target}: the merge failed ({status}); fuzz/corpus/{target} is as it was");
        }
        for e in std::fs::read_dir(&corpus)? {
            std::fs::remove_file(e?.path())?;
        }
        let _ = std::fs::remove_dir_all(&new);
        let mut large = 0;
        for e in std::fs::read_dir(&base)? {
            let e = e?;
            if seed_names.contains(&e.file_name()) {
                continue;
            }
            if e.metadata()?.len() <= COMMIT_MAX_BYTES {
                std::fs::copy(e.path(), corpus.join(e.file_name()))?;
            } else {
                std::fs::create_dir_all(&new)?;
                std::fs::copy(e.path(), new.join(e.file_name()))?;
                large += 1;
            }
        }
        std::fs::remove_dir_all(&base)?;
        let after = count_files(&corpus);
        let _ = writeln!(
            table,
            "| `{target}` | {before} | {n_new} | {} | {after} | {large} |",
            seed_names.len()
        );
    }
    println!("\n{table}");
    say!(
        "commit fuzz/corpus to keep the merged corpus (git add -A fuzz/corpus); inputs over \
         {} KiB stay in {}",
        COMMIT_MAX_BYTES >> 10,
        p.work.join("new").display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzer_stats() {
        let log = "#2\tINITED cov: 10 ft: 11 corp: 1/1b exec/s: 0 rss: 30Mb\n\
                   #512\tpulse  cov: 42 ft: 50 corp: 3/9b lim: 4 exec/s: 256 rss: 31Mb\n\
                   Done 600 runs in 2 second(s)\n\
                   stat::number_of_executed_units: 600\n\
                   stat::new_units_added: 2\n";
        assert_eq!(stat(log, "number_of_executed_units"), Some(600));
        assert_eq!(stat(log, "new_units_added"), Some(2));
        assert_eq!(stat(log, "peak_rss_mb"), None);
        assert_eq!(last_cov(log), Some(42));
    }

    #[test]
    fn every_target_is_listed() {
        let targets = list_targets(&workspace_root()).expect("fuzz/fuzz_targets");
        assert!(targets.len() >= 10, "{targets:?}");
        let cargo = std::fs::read_to_string(workspace_root().join("fuzz/Cargo.toml"))
            .expect("fuzz/Cargo.toml");
        for t in &targets {
            assert!(
                cargo.contains(&format!("name = \"{t}\"")),
                "{t} is not a [[bin]] of fuzz/Cargo.toml"
            );
        }
    }
}
