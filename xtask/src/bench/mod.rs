//! `cargo xtask bench`: our towers against upstream PyTorch on the anchors' shapes
//! (`../shared/anchors/README.md`), in one run on the GPU machine.
//!
//! 1. `xtask/bench/torch_anchor.py` (a subprocess; a finished `--torch-out DIR` is reused instead)
//!    builds each upstream tower + projection at full size with seeded random weights, saves the
//!    weights in the layouts our loaders read and each case's exact inputs, times eager SDPA and
//!    `torch.compile` with CUDA events, and keeps torch's bf16 rows and an f32 reference.
//! 2. In this process: the bf16 GEMM peak (8192³ through gpu-core) and the device-to-device copy
//!    bandwidth; then each family's weights loaded into our CUDA tower (bf16) and every case timed
//!    the same way as torch (CUDA events around the forward + projection, from device-resident
//!    inputs to device-resident rows; warm-up; median of `--iters`), its rows checked against
//!    torch's (rel-L2).
//!    Throughout, a thread samples the card's SM clock, power and clock-event reasons through NVML
//!    (`clocks.rs`); each side's timed window gets the clock it ran at, and the GEMM ceiling is
//!    measured twice: in a short burst and after [`SUSTAIN_S`] seconds of back-to-back GEMMs (the
//!    power limit's steady state).
//! 3. One table on stdout (speed), one for accuracy, and a dated markdown block for
//!    `docs/PERF.md` (`--report`, else `$OUT/bench_report.md`, else beside `anchor.json`); our
//!    numbers also go to `ours.json` beside `anchor.json`.
//!
//! FLOPs are counted analytically from the loaded config with the anchors' formulas (GEMMs
//! 2·m·n·k, attention 4·n²·width per image; norms, activations and rope not counted), and
//! checked against the count the PyTorch side wrote.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use crate::bench_towers::{self as bt, BenchTower, Host, Inputs};
use crate::clocks::{self, Sample};
use gpu_core::Precision;
use gpu_core::{
    bf16, Device, DeviceTower, Epilogue, GemmInputs, GemmOutput, GemmShape, GemmTuned, GemmTuning,
};
pub use vision_towers::tower_core::rel_l2;

const USAGE: &str =
    "usage: cargo xtask bench [--cases LIST] [--no-compile] [--torch-out DIR] [--rerun-torch]
                         [--report PATH] [--iters N] [--warmup N] [--deadline SECONDS]
                         [--python PYTHON] [--tiny] [--host] [--profile] [--precision P]

  --cases LIST       comma list of case names or families (gemma4, glm5_next, step3p7); default all
  --no-compile       skip the torch.compile timings (the slow part of the PyTorch side)
  --torch-out DIR    where the PyTorch side writes weights, inputs, rows and anchor.json; a DIR
                     whose anchor.json is complete and covers the cases is reused
                     (default: $TMPDIR/vt-bench, always re-measured)
  --rerun-torch      run the PyTorch side even if --torch-out DIR is complete
  --report PATH      the markdown block for docs/PERF.md (default $OUT/bench_report.md, else
                     beside anchor.json)
  --iters N          timed runs per case on both sides, median reported (default 20)
  --warmup N         untimed runs first (default 3; torch.compile gets 5)
  --deadline S       seconds after which the PyTorch side starts no new torch.compile case
  --python PYTHON    the interpreter with torch + transformers 5.23 (default $PYTHON or python3)
  --tiny             tiny configs and grids (the PyTorch side on the CPU: a plumbing test)
  --host             our side on the host f32 reference instead of CUDA (with --tiny only)
  --gemm-tuning M    heuristic (cuBLASLt's first answer) or measured (the fastest of its answers, timed
                     once per shape; the default)
  --precision P      our CUDA towers' precision: bf16 (the default, what the anchors compare) or f16
                     (issue 39's gate: its rows' distance from the f32 forward against torch's bf16)
  --profile          after timing, one more eager pass per case with every launch and GEMM timed
                     (CUDA events): where the pass's time goes, per kernel and GEMM shape, printed, in
                     ours.json and as a table in the report (CUDA only)

cases: gemma4_b1 gemma4_b8 glm5_72_b1 glm5_96x128_b1 glm5_72_b8 step_728_b1 step_504_b6 step_728_b8
";

/// Progress on stdout (`crate::progress`), tagged `bench`.
macro_rules! say {
    ($($arg:tt)*) => {
        crate::progress::say("bench", format_args!($($arg)*))
    };
}

/// The project's bound for CUDA bf16 rows against an f32/f64 reference (README, parity).
const BF16_BOUND: f64 = 2e-2;

mod cases;
mod tables;
#[cfg(test)]
mod tests;

pub use cases::*;
pub use tables::*;

// ---------------------------------------------------------------------------------------------
// the command
// ---------------------------------------------------------------------------------------------

struct Opts {
    cases: Vec<&'static CaseDef>,
    compile: bool,
    torch_out: PathBuf,
    explicit_out: bool,
    rerun: bool,
    report: Option<PathBuf>,
    iters: usize,
    warmup: usize,
    deadline: Option<f64>,
    python: String,
    tiny: bool,
    host: bool,
    /// How the device picks GEMM algorithms (`--gemm-tuning heuristic|measured`).
    tuning: GemmTuning,
    /// One profiled eager pass per case after the timing (`--profile`).
    profile: bool,
    /// Our CUDA towers' precision (`--precision`, bf16 by default; f16 for issue 39's gate).
    precision: Precision,
}

fn parse(args: &[String]) -> Result<Opts> {
    let mut cases = None;
    let mut o = Opts {
        cases: Vec::new(),
        compile: true,
        torch_out: std::env::temp_dir().join("vt-bench"),
        explicit_out: false,
        rerun: false,
        report: None,
        iters: 20,
        warmup: 3,
        deadline: None,
        python: std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()),
        tiny: false,
        host: false,
        tuning: GemmTuning::default(),
        profile: false,
        precision: Precision::Bf16,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |what: &str| -> Result<String> {
            it.next()
                .cloned()
                .with_context(|| format!("{a} needs {what}\n{USAGE}"))
        };
        match a.as_str() {
            "--cases" => cases = Some(val("a list")?),
            "--no-compile" => o.compile = false,
            "--torch-out" => {
                o.torch_out = PathBuf::from(val("a directory")?);
                o.explicit_out = true;
            }
            "--rerun-torch" => o.rerun = true,
            "--report" => o.report = Some(PathBuf::from(val("a path")?)),
            "--iters" => o.iters = val("a count")?.parse().context("--iters")?,
            "--warmup" => o.warmup = val("a count")?.parse().context("--warmup")?,
            "--deadline" => o.deadline = Some(val("seconds")?.parse().context("--deadline")?),
            "--python" => o.python = val("an interpreter")?,
            "--tiny" => o.tiny = true,
            "--host" => o.host = true,
            "--profile" => o.profile = true,
            "--precision" => {
                o.precision = match val("bf16 or f16")?.parse()? {
                    p @ (Precision::Bf16 | Precision::F16) => p,
                    Precision::F32 => bail!(
                        "--precision f32: the bench compares 16-bit towers with torch's bf16 (parity checks f32)"
                    ),
                }
            }
            "--gemm-tuning" => {
                o.tuning = match val("heuristic or measured")?.as_str() {
                    "heuristic" => GemmTuning::Heuristic,
                    "measured" => GemmTuning::Measured,
                    other => bail!("--gemm-tuning: `{other}` is neither heuristic nor measured"),
                }
            }
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument `{other}`\n{USAGE}"),
        }
    }
    if o.iters == 0 {
        bail!("--iters must be at least 1");
    }
    if o.profile && o.host {
        bail!("--profile times CUDA launches: not with --host");
    }
    if o.host && !o.tiny {
        bail!(
            "--host runs our f32 host reference: only with --tiny (full size takes hours on a CPU)"
        );
    }
    o.cases = select_cases(cases.as_deref())?;
    Ok(o)
}

/// `xtask/bench/torch_anchor.py` of the repository we run in (the working directory first: the
/// carried binary on the GPU machine runs from a copy of the tree), else of the build's workspace.
fn script() -> Result<PathBuf> {
    let rel = Path::new("xtask").join("bench").join("torch_anchor.py");
    for root in [PathBuf::from("."), crate::workspace_root()] {
        let p = root.join(&rel);
        if p.exists() {
            return Ok(p);
        }
    }
    bail!(
        "{} not found in the working directory or {}",
        rel.display(),
        crate::workspace_root().display()
    )
}

/// The finished anchor.json at `dir` if it covers `o`'s cases (and compile timings if asked).
fn reusable(o: &Opts) -> Option<Value> {
    let text = std::fs::read_to_string(o.torch_out.join("anchor.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    let ok = v["complete"].as_bool() == Some(true)
        && v["tiny"].as_bool() == Some(o.tiny)
        && (!o.compile || v["compile"].as_bool() == Some(true))
        && o.cases.iter().all(|c| v["cases"][c.name].is_object());
    ok.then_some(v)
}

fn run_torch(o: &Opts) -> Result<Value> {
    if o.explicit_out && !o.rerun {
        if let Some(v) = reusable(o) {
            say!(
                "reusing the PyTorch results in {} (measured {}); --rerun-torch measures again",
                o.torch_out.display(),
                v["versions"]["date_utc"].as_str().unwrap_or("?")
            );
            return Ok(v);
        }
    }
    let script = script()?;
    let path = o.torch_out.join("anchor.json");
    // never read an earlier run's results as this one's
    if path.exists() {
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    let names: Vec<&str> = o.cases.iter().map(|c| c.name).collect();
    let mut cmd = Command::new(&o.python);
    cmd.arg(&script)
        .arg("--out")
        .arg(&o.torch_out)
        .args(["--cases", &names.join(",")])
        .args(["--iters", &o.iters.to_string()])
        .args(["--warmup", &o.warmup.to_string()])
        .env("PYTHONUNBUFFERED", "1");
    if !o.compile {
        cmd.arg("--no-compile");
    }
    if o.tiny {
        cmd.arg("--tiny");
    }
    if let Some(d) = o.deadline {
        cmd.args(["--deadline", &d.to_string()]);
    }
    say!(
        "{} {} --out {} --cases {}",
        o.python,
        script.display(),
        o.torch_out.display(),
        names.join(",")
    );
    let t = Instant::now();
    let status = cmd
        .status()
        .with_context(|| format!("starting {} (set --python or $PYTHON)", o.python))?;
    say!(
        "PyTorch side exited with {status} after {:.0} s",
        t.elapsed().as_secs_f64()
    );
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{} after the PyTorch side exited with {status}",
            path.display()
        )
    })?;
    let v: Value = serde_json::from_str(&text).with_context(|| path.display().to_string())?;
    if v["complete"].as_bool() != Some(true) {
        say!("anchor.json is incomplete: going on with the cases it has");
    }
    Ok(v)
}

/// Seconds of back-to-back 8192³ GEMMs before the sustained ceiling is timed: long enough for the
/// power limit's clock reduction to settle (on an H100 at 700 W this GEMM held 1312–1380 MHz
/// after 5 s, against ~1930 in a burst; docs/PERF.md v0.13).
pub const SUSTAIN_S: f64 = 5.0;

/// The measured ceilings of this process.
#[derive(Debug, Clone, Copy)]
struct Ceilings {
    /// bf16 GEMM 8192³ through gpu-core, median of a short burst (TFLOP/s).
    gemm: f64,
    /// The same after [`SUSTAIN_S`] seconds of back-to-back GEMMs (TFLOP/s).
    gemm_sustained: f64,
    /// When the burst and the sustained timing ran (Unix seconds).
    burst_window: (f64, f64),
    /// See `burst_window`.
    sustained_window: (f64, f64),
    /// A 2 GiB device-to-device copy (GB/s, bytes read + written).
    copy: f64,
}

/// The measured ceilings of this process: bf16 GEMM 8192³ through gpu-core (burst and sustained)
/// and a 2 GiB device-to-device copy.
fn ceilings(dev: &Device, warmup: usize, iters: usize) -> Result<Ceilings> {
    let s = 8192usize;
    let rand = |seed: u64| -> Vec<bf16> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..s * s)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                let u = (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
                bf16::from_f32(2.0 * u - 1.0)
            })
            .collect()
    };
    let x = dev.upload(&rand(1))?;
    let w = dev.upload(&rand(2))?;
    let mut y = dev.alloc::<bf16>(s * s)?;
    let mut gemm_ms = |warm: usize| {
        dev.time_ms(warm, iters.max(10), || {
            dev.gemm(
                GemmInputs::Bf16 { x: &x, w: &w },
                None,
                GemmOutput::Bf16(&mut y),
                GemmShape::dense(s, s, s),
                Epilogue::None,
            )
        })
    };
    let tflops = |t: &[f32]| 2.0 * (s as f64).powi(3) / t[t.len() / 2] as f64 / 1e9;
    let burst = gemm_ms(warmup)?;
    let b1 = clocks::unix_now();
    // As many GEMMs as SUSTAIN_S seconds hold at the burst rate, then the same timing.
    let sustain_runs = (SUSTAIN_S * 1e3 / f64::from(burst[burst.len() / 2]).max(1e-3)) as usize;
    let sustained = gemm_ms(sustain_runs.min(1 << 16))?;
    let s1 = clocks::unix_now();
    let secs = |t: &[f32]| t.iter().map(|&m| f64::from(m)).sum::<f64>() / 1e3;
    let gemm = tflops(&burst);
    let gemm_sustained = tflops(&sustained);
    drop((x, w, y));
    let n = 1usize << 29; // 2 GiB of f32
    let a = dev.alloc::<f32>(n)?;
    let mut b = dev.alloc::<f32>(n)?;
    let t = dev.time_ms(warmup, iters.max(10), || dev.copy(&a, &mut b))?;
    let copy = 2.0 * 4.0 * n as f64 / t[t.len() / 2] as f64 / 1e6;
    Ok(Ceilings {
        gemm,
        gemm_sustained,
        // the timed runs only (the burst's warm-up is short; the sustained one's is the point)
        burst_window: (b1 - secs(&burst), b1),
        sustained_window: (s1 - secs(&sustained), s1),
        copy,
    })
}

/// What `run_family` measured for one family.
#[derive(Default)]
struct FamilyResult {
    note: String,
    json: Value,
}

/// Where our side runs.
enum Side {
    Cuda(Arc<Device>),
    Host,
    None(String),
}

/// Loads one family and runs its cases, filling `lines` (indexed like `cases`).
fn run_family(
    o: &Opts,
    side: &Side,
    fam: Family,
    anchor: &Value,
    cases: &[&CaseDef],
    lines: &mut [Line],
) -> Result<FamilyResult> {
    let rel = anchor["families"][fam.key()]["weights"]
        .as_str()
        .with_context(|| format!("anchor.json has no weights for {}", fam.key()))?;
    let dir = o.torch_out.join(rel);
    let cuda = match side {
        Side::None(_) => {
            return Ok(FamilyResult {
                note: "no device".into(),
                json: Value::Null,
            })
        }
        Side::Cuda(d) => Some(d),
        Side::Host => None,
    };
    say!("loading {} from {}", fam.key(), dir.display());
    macro_rules! go {
        ($loaded:expr, $dims:expr, $images:ident) => {{
            let (mut tower, load_s, upload_s, bytes) = $loaded;
            let dims = $dims;
            let dev = cuda.map(|d| &**d);
            let cases_json =
                run_cases(o, dev, &mut tower, dims, anchor, cases, lines, Inputs::$images)?;
            Ok(FamilyResult {
                note: String::new(),
                json: json!({
                    "load_s": load_s, "upload_s": upload_s,
                    "weight_mib": bytes as f64 / (1u64 << 20) as f64, "cases": cases_json,
                }),
            })
        }};
    }
    match (fam, cuda) {
        (Family::Gemma4, Some(d)) => {
            let l = bt::gemma_cuda(d, &dir, o.precision)?;
            let dims = gemma_dims(l.tower.config());
            go!((l.tower, l.load_s, l.upload_s, l.weight_bytes), dims, gemma)
        }
        (Family::Glm5Next, Some(d)) => {
            let l = bt::glm_cuda(d, &dir, o.precision)?;
            let dims = glm_dims(l.tower.config());
            go!((l.tower, l.load_s, l.upload_s, l.weight_bytes), dims, glm)
        }
        (Family::Step3p7, Some(d)) => {
            let l = bt::step_cuda(d, &dir, o.precision)?;
            let dims = step_dims(l.tower.config());
            go!((l.tower, l.load_s, l.upload_s, l.weight_bytes), dims, step)
        }
        (Family::Gemma4, None) => {
            let (t, load_s) = bt::load_gemma(&dir)?;
            let dims = gemma_dims(&t.config);
            go!((Host::new(t), load_s, 0.0, 0usize), dims, gemma)
        }
        (Family::Glm5Next, None) => {
            let (t, load_s) = bt::load_glm(&dir)?;
            let dims = glm_dims(&t.config);
            go!((Host::new(t), load_s, 0.0, 0usize), dims, glm)
        }
        (Family::Step3p7, None) => {
            let (t, load_s) = bt::load_step(&dir)?;
            let dims = step_dims(&t.config);
            go!((Host::new(t), load_s, 0.0, 0usize), dims, step)
        }
    }
}

/// The geometry anchor.json records for `c` (tiny runs differ from the full-size table).
fn case_geometry(anchor: &Value, c: &CaseDef) -> Result<Option<Geometry>> {
    let g = &anchor["cases"][c.name]["geometry"];
    if g.is_null() {
        return Ok(None);
    }
    let get = |k: &str| g[k].as_u64().map(|v| v as usize);
    Ok(Some(match (get("gw"), get("gh"), get("side")) {
        (Some(gw), Some(gh), None) => Geometry::Grid { gw, gh },
        (None, None, Some(s)) => Geometry::Side(s),
        _ => bail!("{}: geometry {g} is neither a grid nor a side", c.name),
    }))
}

fn read_rows(anchor: &Value, dir: &Path, case: &str, key: &str) -> Result<Option<Vec<f32>>> {
    let Some(rel) = anchor["cases"][case][key].as_str() else {
        return Ok(None);
    };
    let ck = bt::open(&dir.join(rel))?;
    Ok(Some(bt::f32_tensor(&ck, "rows")?.data))
}

/// One eager pass (graphs off) with every launch and GEMM bracketed by CUDA events; prints where
/// the time went (largest first) and returns it.
fn profile_pass<T: BenchTower>(
    d: &Device,
    tower: &mut T,
    batch: &T::Batch<'_>,
    name: &str,
) -> Result<Vec<gpu_core::OpTime>> {
    tower.set_graphs(false);
    d.profile_begin();
    let run = tower.run(batch);
    let ops = d.profile_end();
    tower.set_graphs(true);
    run?;
    let ops = ops?;
    let total: f64 = ops.iter().map(|o| o.ms).sum();
    say!(
        "ours {name:16} profile: one eager pass, {total:.2} ms in {} kinds of operation",
        ops.len()
    );
    for op in ops.iter().filter(|op| op.ms >= 0.005 * total) {
        let tflops = gemm_tflops(op);
        say!(
            "  {:9.3} ms {:5.1} % {:5}× {}{}",
            op.ms,
            100.0 * op.ms / total,
            op.calls,
            op.label,
            tflops.map_or(String::new(), |t| format!("  ({t:.0} TFLOP/s)"))
        );
    }
    Ok(ops)
}

/// `--profile` as JSON for `ours.json` (GEMM rows with their TFLOP/s).
fn profile_json(ops: &[gpu_core::OpTime]) -> Value {
    Value::Array(
        ops.iter()
            .map(|op| {
                let tflops = gemm_tflops(op);
                json!({"label": op.label, "calls": op.calls, "ms": op.ms, "tflops": tflops})
            })
            .collect(),
    )
}

/// The `--profile` table (markdown): each case's profiled eager pass split into GEMMs, attention
/// and the other (memory-bound) kernels, with the three largest of those by kernel name.
pub fn profile_table(lines: &[Line]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| case | profiled ms | GEMMs | attention | other kernels | largest other kernels (ms) |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for l in lines.iter().filter(|l| !l.profile.is_empty()) {
        let total: f64 = l.profile.iter().map(|o| o.ms).sum();
        let (mut gemm, mut attn) = (0.0, 0.0);
        let mut other: Vec<(&str, f64)> = Vec::new();
        for op in &l.profile {
            let kernel = op.label.split(' ').next().unwrap_or("");
            // cuBLASLt's GEMMs and the fused-epilogue GEMM kernels (gemm_act_*_sm90a, gemm_gate_*_sm90a)
            if kernel == "gemm" || kernel.starts_with("gemm_") {
                gemm += op.ms;
            } else if kernel.starts_with("flash_attn") {
                attn += op.ms;
            } else {
                match other.iter_mut().find(|(k, _)| *k == kernel) {
                    Some((_, ms)) => *ms += op.ms,
                    None => other.push((kernel, op.ms)),
                }
            }
        }
        other.sort_by(|a, b| b.1.total_cmp(&a.1));
        let rest: f64 = other.iter().map(|(_, ms)| ms).sum();
        let share = |v: f64| format!("{v:.2} ({:.0} %)", 100.0 * v / total);
        let top: Vec<String> = other
            .iter()
            .take(3)
            .map(|(k, ms)| format!("{k} {ms:.2}"))
            .collect();
        let _ = writeln!(
            s,
            "| {} | {total:.2} | {} | {} | {} | {} |",
            l.label,
            share(gemm),
            share(attn),
            share(rest),
            top.join(", ")
        );
    }
    s
}

/// The rate a profiled GEMM ran at, in TFLOP/s (None for kernels).
fn gemm_tflops(op: &gpu_core::OpTime) -> Option<f64> {
    gemm_flops(&op.label).map(|f| f * op.calls as f64 / op.ms / 1e9)
}

/// 2·m·n·k of a profile label `gemm m×n×k…` (None for other labels).
fn gemm_flops(label: &str) -> Option<f64> {
    let dims = label.strip_prefix("gemm ")?.split(' ').next()?;
    let v: Vec<f64> = dims
        .split('×')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    (v.len() == 3).then(|| 2.0 * v[0] * v[1] * v[2])
}

/// Runs `cases` of one family on `tower`: rows checked against torch's, then timed.
#[allow(clippy::too_many_arguments)]
fn run_cases<T: BenchTower>(
    o: &Opts,
    dev: Option<&Device>,
    tower: &mut T,
    dims: Dims,
    anchor: &Value,
    cases: &[&CaseDef],
    lines: &mut [Line],
    images: impl for<'a> Fn(&'a Inputs) -> Result<Vec<T::Image<'a>>>,
) -> Result<Value> {
    let mut out = serde_json::Map::new();
    for (c, l) in cases.iter().zip(lines.iter_mut()) {
        let r = (|| -> Result<Value> {
            let geom = case_geometry(anchor, c)?.context("anchor.json has no such case")?;
            if !o.tiny && geom != c.geometry {
                say!(
                    "WARNING {}: geometry {geom:?} is not the anchors' {:?}",
                    c.name,
                    c.geometry
                );
            }
            l.flops = flops(dims, geom, c.batch)?;
            if !o.tiny && dims != anchor_dims(c.family) {
                say!(
                    "WARNING {}: the loaded config {dims:?} is not the anchors' {:?}",
                    c.name,
                    anchor_dims(c.family)
                );
            }
            let theirs = anchor["cases"][c.name]["flops"].as_f64();
            if let Some(t) = theirs.filter(|t| (t - l.flops).abs() > 1e-9 * l.flops) {
                say!(
                    "WARNING {}: our FLOP count {:.6e} differs from the PyTorch side's {t:.6e}",
                    c.name,
                    l.flops
                );
            }
            let rel = anchor["cases"][c.name]["inputs"]
                .as_str()
                .context("no inputs recorded")?;
            let inputs = Inputs::read(c.family.key(), &o.torch_out.join(rel))?;
            let imgs = images(&inputs)?;
            let batch = tower.prepare(&imgs)?;
            tower.run(&batch)?;
            let rows = tower.rows(&batch)?;
            let t_bf16 = read_rows(anchor, &o.torch_out, c.name, "rows_bf16")?;
            let t_f32 = read_rows(anchor, &o.torch_out, c.name, "rows_f32")?;
            l.rel_torch_bf16 = t_bf16.as_ref().map(|t| rel_l2(&rows, t));
            l.rel_f32 = t_f32.as_ref().map(|t| rel_l2(&rows, t));
            drop((rows, t_bf16, t_f32));
            let before = tower.graph_stats();
            let w0 = clocks::unix_now();
            let times = bt::time_runs(dev, tower, &batch, o.warmup, o.iters)?;
            let med = times[times.len() / 2] as f64;
            let after = tower.graph_stats();
            let held = clocks::unix_now() - w0;
            if held < clocks::ENERGY_WINDOW_S && med > 0.0 {
                // more of the same runs (their times discarded), so the energy counter spans the window
                let more = ((clocks::ENERGY_WINDOW_S - held) * 1e3 / med).ceil();
                bt::time_runs(dev, tower, &batch, 0, (more as usize).clamp(1, 10_000))?;
            }
            l.ours_window = Some((w0, clocks::unix_now()));
            l.ours_ms = Some(med);
            // The same span with every kernel launched eagerly (graphs off), then back on; the
            // host towers have no graphs.
            let replays = after.zip(before).map(|(a, b)| a.replays - b.replays);
            let mut eager = Vec::new();
            if replays.is_some() {
                tower.set_graphs(false);
                let r = bt::time_runs(dev, tower, &batch, o.warmup, o.iters);
                tower.set_graphs(true);
                eager = r?;
                let eager_med = eager[eager.len() / 2] as f64;
                l.ours_eager_ms = Some(eager_med);
                l.graph_replays = replays;
                say!(
                    "ours {:16} graphs off {eager_med:9.2} ms, on {med:9.2} ms ({} replays timed)",
                    c.name,
                    replays.unwrap_or(0)
                );
            }
            if let (true, Some(d)) = (o.profile, dev) {
                l.profile = profile_pass(d, tower, &batch, c.name)?;
            }
            say!(
                "ours {:16} {med:9.2} ms (min {:.2}, max {:.2})  {:.0} TFLOP/s  rel-L2 vs f32 {}",
                c.name,
                times[0],
                times[times.len() - 1],
                l.flops / med / 1e9,
                sci(l.rel_f32)
            );
            Ok(json!({
                "ms": med, "times": times, "flops": l.flops,
                "eager_ms": l.ours_eager_ms, "eager_times": eager, "graph_replays": replays,
                "rel_torch_bf16": l.rel_torch_bf16, "rel_f32": l.rel_f32,
                "torch_rel_f32": l.torch_rel_f32, "profile": profile_json(&l.profile),
                "window_unix_s": l.ours_window,
            }))
        })();
        match r {
            Ok(v) => {
                out.insert(c.name.into(), v);
            }
            Err(e) => {
                say!("ours {} FAILED: {e:#}", c.name);
                l.ours_note = "failed".into();
                out.insert(c.name.into(), json!({ "error": format!("{e:#}") }));
            }
        }
    }
    Ok(Value::Object(out))
}

fn nvidia_smi() -> Option<String> {
    let o = Command::new("nvidia-smi")
        .args([
            "--query-gpu=name,driver_version,clocks.max.sm,power.limit",
            "--format=csv,noheader",
        ])
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// `cargo xtask bench`.
pub fn run(args: &[String]) -> Result<()> {
    let o = parse(args)?;
    let t0 = *crate::progress::started();
    std::fs::create_dir_all(&o.torch_out)
        .with_context(|| format!("creating {}", o.torch_out.display()))?;
    // Sampled from here on, the PyTorch subprocess's timed runs included.
    let sampler = match clocks::Sampler::start() {
        Ok(s) => Some(s),
        Err(why) => {
            say!("clock sampling off: {why}");
            None
        }
    };
    let anchor = run_torch(&o)?;

    // our side, in this process
    let side = if o.host {
        Side::Host
    } else {
        match crate::parity_device::shared_device() {
            Ok(d) => Side::Cuda(d),
            Err(why) => Side::None(why.to_string()),
        }
    };
    let mut device_name = String::from("host CPU");
    let mut ceil = None;
    match &side {
        Side::Cuda(d) => {
            d.set_gemm_tuning(o.tuning);
            say!("GEMM algorithms: {:?}", o.tuning);
            device_name = format!("{} ({} SMs)", d.name()?, d.multiprocessors()?);
            let c = ceilings(d, o.warmup, o.iters)?;
            let samples = sampler.as_ref().map(|s| s.samples()).unwrap_or_default();
            let at = |w: (f64, f64)| clocks::window_cell(&samples, Some(w));
            say!(
                "ceilings (gpu-core, this process): bf16 GEMM 8192³ {:.0} TFLOP/s in a burst ({}), {:.0} after {SUSTAIN_S} s of GEMMs ({}); device-to-device copy {:.0} GB/s",
                c.gemm,
                at(c.burst_window),
                c.gemm_sustained,
                at(c.sustained_window),
                c.copy
            );
            ceil = Some(c);
        }
        Side::None(why) => say!("our side not run: {why}"),
        Side::Host => say!("our side on the host f32 reference (plumbing test)"),
    }

    let peak = ceil.map(|c| c.gemm);
    let window = |a: &Value, key: &str| match a[key].as_array().map(|v| v.as_slice()) {
        Some([t0, t1]) => t0.as_f64().zip(t1.as_f64()),
        _ => None,
    };
    let mut lines: Vec<Line> = o
        .cases
        .iter()
        .map(|c| {
            let a = &anchor["cases"][c.name];
            let compile_note = match a["compile_error"].as_str() {
                Some(e) if e.contains("deadline") => "skipped".to_string(),
                Some(_) => "failed".to_string(),
                None if !o.compile => "not run".to_string(),
                None => String::new(),
            };
            let torch_rel_f32 = match (
                read_rows(&anchor, &o.torch_out, c.name, "rows_bf16"),
                read_rows(&anchor, &o.torch_out, c.name, "rows_f32"),
            ) {
                (Ok(Some(a)), Ok(Some(b))) => Some(rel_l2(&a, &b)),
                _ => None,
            };
            let rows = a["rows"].as_array().map(|w| {
                let dim = |i: usize| w.get(i).and_then(Value::as_u64).unwrap_or(0) as usize;
                (dim(0), dim(1))
            });
            Line {
                rows,
                torch_rel_f32,
                name: c.name.into(),
                label: c.label.into(),
                batch: c.batch,
                flops: a["flops"].as_f64().unwrap_or(0.0),
                eager_ms: a["eager_ms"].as_f64(),
                compile_ms: a["compile_ms"].as_f64(),
                compile_note,
                eager_window: window(a, "eager_window"),
                compile_window: window(a, "compile_window"),
                ..Line::default()
            }
        })
        .collect();
    let mut families = serde_json::Map::new();
    let mut tuned: Vec<(&'static str, GemmTuned)> = Vec::new();
    for fam in Family::ALL {
        let idx: Vec<usize> = (0..o.cases.len())
            .filter(|&i| o.cases[i].family == fam)
            .collect();
        if idx.is_empty() {
            continue;
        }
        let cases: Vec<&CaseDef> = idx.iter().map(|&i| o.cases[i]).collect();
        let mut fam_lines: Vec<Line> = idx.iter().map(|&i| lines[i].clone()).collect();
        let t = Instant::now();
        let tuned_before = tuned_len(&side);
        let r = run_family(&o, &side, fam, &anchor, &cases, &mut fam_lines);
        if let Side::Cuda(d) = &side {
            tuned.extend(
                d.gemm_tuned()
                    .into_iter()
                    .skip(tuned_before)
                    .map(|g| (fam.key(), g)),
            );
        }
        match r {
            Ok(res) => {
                for l in fam_lines.iter_mut().filter(|l| l.ours_ms.is_none()) {
                    if l.ours_note.is_empty() {
                        l.ours_note = res.note.clone();
                    }
                }
                families.insert(fam.key().into(), res.json);
            }
            Err(e) => {
                say!("{} FAILED: {e:#}", fam.key());
                for l in &mut fam_lines {
                    l.ours_note = "failed".into();
                }
                families.insert(fam.key().into(), json!({ "error": format!("{e:#}") }));
            }
        }
        say!("{} done in {:.1} s", fam.key(), t.elapsed().as_secs_f64());
        for (k, &i) in idx.iter().enumerate() {
            lines[i] = fam_lines[k].clone();
        }
    }

    // the report
    let v = &anchor["versions"];
    let vs = |k: &str| match &v[k] {
        Value::String(s) => s.clone(),
        Value::Null => "?".into(),
        other => other.to_string(),
    };
    let tp = &anchor["ceilings"];
    let samples = sampler.as_ref().map(|s| s.samples()).unwrap_or_default();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### `cargo xtask bench` — {} ({})\n",
        today(),
        device_name
    );
    let _ = writeln!(
        md,
        "Card: {}; driver {} (nvidia-smi: {}). PyTorch side: torch {} (CUDA {}, cuDNN {}), transformers {}, measured {}{}.",
        vs("device"),
        vs("driver"),
        vs("nvidia_smi"),
        vs("torch"),
        vs("cuda"),
        vs("cudnn"),
        vs("transformers"),
        vs("date_utc"),
        if anchor["tiny"].as_bool() == Some(true) { " (TINY configs: a plumbing test, not a measurement)" } else { "" },
    );
    let _ = writeln!(
        md,
        "Ceilings, our process (gpu-core): bf16 GEMM 8192³ {} TFLOP/s in a short burst ({}), {} TFLOP/s after {SUSTAIN_S} s of back-to-back GEMMs ({}{}); device-to-device copy {} GB/s; PyTorch's process: {} TFLOP/s, {} GB/s.",
        peak.map_or("—".into(), |p| format!("{p:.0}")),
        clocks::window_cell(&samples, ceil.map(|c| c.burst_window)),
        ceil.map_or("—".into(), |c| format!("{:.0}", c.gemm_sustained)),
        clocks::window_cell(&samples, ceil.map(|c| c.sustained_window)),
        ceil.and_then(|c| {
            let (t0, t1) = c.sustained_window;
            let w = clocks::window_stats(&samples, t0, t1)?;
            (c.gemm_sustained > 0.0)
                .then(|| format!(", {:.2} pJ/FLOP", w.power_w() / c.gemm_sustained))
        })
        .unwrap_or_default(),
        ceil.map_or("—".into(), |c| format!("{:.0}", c.copy)),
        tp["gemm_bf16_8192_tflops"].as_f64().map_or("—".into(), |p| format!("{p:.0}")),
        tp["copy_gbs"].as_f64().map_or("—".into(), |c| format!("{c:.0}")),
    );
    let _ = writeln!(
        md,
        "Method: same inputs both sides (saved by `xtask/bench/torch_anchor.py`); our towers in {}; CUDA events around forward + projection from device-resident inputs to device-resident rows; warm-up {} runs ({} after torch.compile), then the median of {}; torch.compile default mode over SDPA, one static compile per case. TFLOP/s and floor: analytic FLOPs at the measured gpu-core peak.\n",
        o.precision,
        o.warmup,
        anchor["compile_warmup"].as_u64().unwrap_or(5),
        o.iters
    );
    md.push_str(&speed_table(&lines, peak));
    md.push('\n');
    md.push_str(&graph_table(&lines));
    md.push('\n');
    if !samples.is_empty() {
        md.push_str("The card's SM clock during each side's timed runs (NVML, every 20 ms; \"capped\": the power-limit reason set; power and J/image from the energy counter over the window, which each side holds open ≥ 1 s with more untimed runs of the same work):\n\n");
        md.push_str(&clock_table(
            &lines,
            &samples,
            ceil.map(|c| c.gemm_sustained),
        ));
        md.push('\n');
    }
    if lines.iter().any(|l| !l.profile.is_empty()) {
        md.push_str("One eager pass per case with every launch and GEMM between CUDA events (`--profile`; the events' own cost shows where operations are short):\n\n");
        md.push_str(&profile_table(&lines));
        md.push('\n');
    }
    md.push_str(&accuracy_table(&lines, o.precision));
    if anchor["tiny"].as_bool() != Some(true) {
        md.push('\n');
        md.push_str(&anchors_table(&lines));
    }
    if !tuned.is_empty() {
        md.push('\n');
        md.push_str(&tuning_table(&tuned));
    }
    let mut load = String::new();
    for (k, f) in &families {
        if let (Some(l), Some(u), Some(m)) = (
            f["load_s"].as_f64(),
            f["upload_s"].as_f64(),
            f["weight_mib"].as_f64().filter(|m| *m > 0.0),
        ) {
            let _ = write!(
                load,
                "{}{k} {m:.0} MiB (load {l:.1} s + upload {u:.1} s)",
                if load.is_empty() { "" } else { "; " }
            );
        }
    }
    if !load.is_empty() {
        let _ = writeln!(
            md,
            "\nWeights resident on the device (uploaded straight from the memory-mapped file, no host f32 copy): {load}."
        );
    }
    let report = o
        .report
        .clone()
        .or_else(|| std::env::var_os("OUT").map(|d| PathBuf::from(d).join("bench_report.md")))
        .unwrap_or_else(|| o.torch_out.join("bench_report.md"));
    if let Some(p) = report.parent() {
        std::fs::create_dir_all(p).ok();
    }
    std::fs::write(&report, &md).with_context(|| format!("writing {}", report.display()))?;
    let ours = json!({
        "date": today(), "device": device_name, "nvidia_smi": nvidia_smi(), "precision": o.precision.name(),
        "ceilings": {
            "gemm_bf16_8192_tflops": peak,
            "gemm_bf16_8192_sustained_tflops": ceil.map(|c| c.gemm_sustained),
            "copy_gbs": ceil.map(|c| c.copy),
        },
        "clock_samples": samples.iter().map(|x| json!([x.t, x.sm_mhz, x.power_w, x.reasons, x.energy_mj])).collect::<Vec<_>>(),
        "iters": o.iters, "warmup": o.warmup, "families": families,
        "wall_s": t0.elapsed().as_secs_f64(),
    });
    let ours_path = o.torch_out.join("ours.json");
    std::fs::write(&ours_path, serde_json::to_string_pretty(&ours)?)
        .with_context(|| format!("writing {}", ours_path.display()))?;
    say!(
        "report {}; our numbers {}; {:.0} s in all\n",
        report.display(),
        ours_path.display(),
        t0.elapsed().as_secs_f64()
    );
    print!("{}", accuracy_table(&lines, o.precision));
    println!();
    print!("{}", graph_table(&lines));
    println!();
    print!("{}", speed_table(&lines, peak));
    Ok(())
}
