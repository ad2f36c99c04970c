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
use gpu_core::{
    bf16, Device, DeviceTower, Epilogue, GemmInputs, GemmOutput, GemmShape, GemmTuned, GemmTuning,
};
pub use vision_towers::tower_core::rel_l2;

const USAGE: &str =
    "usage: cargo xtask bench [--cases LIST] [--no-compile] [--torch-out DIR] [--rerun-torch]
                         [--report PATH] [--iters N] [--warmup N] [--deadline SECONDS]
                         [--python PYTHON] [--tiny] [--host] [--profile]

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

/// A tower family, keyed as the PyTorch side keys it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `Gemma4VisionModel` + `Gemma4MultimodalEmbedder`.
    Gemma4,
    /// `Glm5NextVisionModel` (its merger is the projection).
    Glm5Next,
    /// `Step3p7VisionModel` + `multi_modal_projector`.
    Step3p7,
}

impl Family {
    const ALL: [Family; 3] = [Family::Gemma4, Family::Glm5Next, Family::Step3p7];

    fn key(self) -> &'static str {
        match self {
            Family::Gemma4 => "gemma4",
            Family::Glm5Next => "glm5_next",
            Family::Step3p7 => "step3p7",
        }
    }
}

/// A published row of the anchors' table (H200, 2026-11-29): ms and TFLOP/s, SDPA and compile.
#[derive(Debug, Clone, Copy)]
pub struct Anchor {
    sdpa_ms: f64,
    /// The anchors' TFLOP/s: the tests' oracle for our FLOP count.
    #[cfg_attr(not(test), allow(dead_code))]
    sdpa_tflops: f64,
    compile_ms: f64,
    #[cfg_attr(not(test), allow(dead_code))]
    compile_tflops: f64,
}

/// One case of the anchors' table.
#[derive(Debug, Clone, Copy)]
pub struct CaseDef {
    /// The name `--cases` and the PyTorch side use.
    pub name: &'static str,
    /// Its family.
    pub family: Family,
    /// The table's label.
    pub label: &'static str,
    /// Images per batch.
    pub batch: usize,
    /// The full-size geometry.
    pub geometry: Geometry,
    /// The anchors' published numbers for it.
    pub anchor: Anchor,
}

/// The patch geometry of one image of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Geometry {
    /// A patch grid, `gw` columns × `gh` rows (gemma4, glm5_next).
    Grid {
        /// Patch columns.
        gw: usize,
        /// Patch rows.
        gh: usize,
    },
    /// A square view of `side` pixels (step3p7).
    Side(usize),
}

const fn anchor(sdpa_ms: f64, sdpa_tflops: f64, compile_ms: f64, compile_tflops: f64) -> Anchor {
    Anchor {
        sdpa_ms,
        sdpa_tflops,
        compile_ms,
        compile_tflops,
    }
}

/// The anchors' cases, in their table's order (`../shared/anchors/README.md`).
pub const CASES: [CaseDef; 8] = [
    CaseDef {
        name: "gemma4_b1",
        family: Family::Gemma4,
        label: "gemma4 42×57 (2394) b1",
        batch: 1,
        geometry: Geometry::Grid { gw: 42, gh: 57 },
        anchor: anchor(39.0, 85.0, 14.9, 223.0),
    },
    CaseDef {
        name: "gemma4_b8",
        family: Family::Gemma4,
        label: "gemma4 42×57 b8",
        batch: 8,
        geometry: Geometry::Grid { gw: 42, gh: 57 },
        anchor: anchor(138.4, 192.0, 86.4, 308.0),
    },
    CaseDef {
        name: "glm5_72_b1",
        family: Family::Glm5Next,
        label: "glm5_next 72×72 (5184) b1",
        batch: 1,
        geometry: Geometry::Grid { gw: 72, gh: 72 },
        anchor: anchor(34.7, 208.0, 20.9, 347.0),
    },
    CaseDef {
        name: "glm5_96x128_b1",
        family: Family::Glm5Next,
        label: "glm5_next 96×128 (12288) b1",
        batch: 1,
        geometry: Geometry::Grid { gw: 128, gh: 96 },
        anchor: anchor(90.5, 285.0, 59.4, 434.0),
    },
    CaseDef {
        name: "glm5_72_b8",
        family: Family::Glm5Next,
        label: "glm5_next 72×72 b8",
        batch: 8,
        geometry: Geometry::Grid { gw: 72, gh: 72 },
        anchor: anchor(233.9, 248.0, 137.3, 422.0),
    },
    CaseDef {
        name: "step_728_b1",
        family: Family::Step3p7,
        label: "step3p7 728 view (2704) b1",
        batch: 1,
        geometry: Geometry::Side(728),
        anchor: anchor(38.0, 306.0, 26.2, 445.0),
    },
    CaseDef {
        name: "step_504_b6",
        family: Family::Step3p7,
        label: "step3p7 504 tiles (1296) b6",
        batch: 6,
        geometry: Geometry::Side(504),
        anchor: anchor(92.4, 328.0, 62.6, 484.0),
    },
    CaseDef {
        name: "step_728_b8",
        family: Family::Step3p7,
        label: "step3p7 728 view b8",
        batch: 8,
        geometry: Geometry::Side(728),
        anchor: anchor(271.3, 343.0, 188.7, 493.0),
    },
];

/// Resolves `--cases` (names or families, comma-separated) to cases in table order.
pub fn select_cases(spec: Option<&str>) -> Result<Vec<&'static CaseDef>> {
    let Some(spec) = spec.filter(|s| !s.is_empty() && *s != "all") else {
        return Ok(CASES.iter().collect());
    };
    let mut keep = vec![false; CASES.len()];
    for tok in spec.split(',').map(str::trim) {
        let mut hit = false;
        for (i, c) in CASES.iter().enumerate() {
            if c.name == tok || c.family.key() == tok {
                keep[i] = true;
                hit = true;
            }
        }
        if !hit {
            bail!("unknown case or family `{tok}`\n{USAGE}");
        }
    }
    Ok(CASES
        .iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(c, _)| c)
        .collect())
}

// ---------------------------------------------------------------------------------------------
// FLOPs
// ---------------------------------------------------------------------------------------------

/// The dimensions the FLOP count reads, from a loaded config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dims {
    /// Gemma-4: attention width `heads·head_dim`, pooling `pool×pool`, embedder into `text`.
    Gemma {
        hidden: usize,
        width: usize,
        inter: usize,
        layers: usize,
        patch_dim: usize,
        pool: usize,
        text: usize,
    },
    /// GLM: `unit` = merge², merger `out → 2·merger_inner → out` (gate|up, down) after `out × out`.
    Glm {
        hidden: usize,
        inter: usize,
        layers: usize,
        patch_dim: usize,
        unit: usize,
        out: usize,
        merger_inner: usize,
    },
    /// Step-3.7: two 3×3 stride-2 downsamplers (H → 2H → 4H), projector `4H → text`.
    Step {
        hidden: usize,
        inter: usize,
        layers: usize,
        patch: usize,
        text: usize,
    },
}

/// Analytic FLOPs of one forward + projection over `batch` images of geometry `g` (the anchors'
/// formulas, `torch_anchor.py` counts the same): GEMMs and convs 2·m·n·k, attention 4·n²·width
/// per image (QKᵀ and PV).
pub fn flops(d: Dims, g: Geometry, batch: usize) -> Result<f64> {
    let b = batch as u128;
    let u = |v: usize| v as u128;
    let f = match (d, g) {
        (
            Dims::Gemma {
                hidden,
                width,
                inter,
                layers,
                patch_dim,
                pool,
                text,
            },
            Geometry::Grid { gw, gh },
        ) => {
            let (h, w, i, l, p, t) = (
                u(hidden),
                u(width),
                u(inter),
                u(layers),
                u(patch_dim),
                u(text),
            );
            let n = u(gw * gh);
            let rows = n / u(pool * pool);
            b * (2 * n * p * h
                + l * (2 * n * (3 * w * h + w * h) + 2 * n * 3 * h * i + 4 * n * n * w)
                + 2 * rows * h * t)
        }
        (
            Dims::Glm {
                hidden,
                inter,
                layers,
                patch_dim,
                unit,
                out,
                merger_inner,
            },
            Geometry::Grid { gw, gh },
        ) => {
            let (h, i, l, p, un, o, pi) = (
                u(hidden),
                u(inter),
                u(layers),
                u(patch_dim),
                u(unit),
                u(out),
                u(merger_inner),
            );
            let n = u(gw * gh);
            let t = n / un;
            b * (2 * n * p * h
                + l * (2 * n * 4 * h * h + 2 * n * 3 * h * i + 4 * n * n * h)
                + 2 * t * un * h * o
                + 2 * t * o * o
                + 2 * t * 3 * o * pi)
        }
        (
            Dims::Step {
                hidden,
                inter,
                layers,
                patch,
                text,
            },
            Geometry::Side(side),
        ) => {
            let (h, i, l, p, t) = (u(hidden), u(inter), u(layers), u(patch), u(text));
            let g = u(side) / p;
            let n = g * g;
            let g1 = (g - 1) / 2 + 1;
            let g2 = (g1 - 1) / 2 + 1;
            b * (2 * n * 3 * p * p * h
                + l * (2 * n * 4 * h * h + 2 * n * 2 * h * i + 4 * n * n * h)
                + 2 * g1 * g1 * 9 * h * 2 * h
                + 2 * g2 * g2 * 9 * 2 * h * 4 * h
                + 2 * g2 * g2 * 4 * h * t)
        }
        (d, g) => bail!("geometry {g:?} does not fit the family of {d:?}"),
    };
    Ok(f as f64)
}

/// The full-size dimensions of the anchors' configs (for the tests and the offline table).
pub fn anchor_dims(f: Family) -> Dims {
    match f {
        Family::Gemma4 => Dims::Gemma {
            hidden: 1152,
            width: 16 * 72,
            inter: 4304,
            layers: 27,
            patch_dim: 3 * 16 * 16,
            pool: 3,
            text: 5376,
        },
        Family::Glm5Next => Dims::Glm {
            hidden: 1024,
            inter: 4096,
            layers: 24,
            patch_dim: 3 * 2 * 14 * 14,
            unit: 4,
            out: 4096,
            merger_inner: 10240,
        },
        Family::Step3p7 => Dims::Step {
            hidden: 1536,
            inter: 8960,
            layers: 47,
            patch: 14,
            text: 4096,
        },
    }
}

fn gemma_dims(c: &tower_gemma::GemmaConfig) -> Dims {
    Dims::Gemma {
        hidden: c.hidden,
        width: c.heads * c.head_dim,
        inter: c.intermediate,
        layers: c.layers,
        patch_dim: c.patch_dim(),
        pool: c.pool,
        text: c.text_hidden,
    }
}

fn glm_dims(c: &tower_glm5::GlmConfig) -> Dims {
    Dims::Glm {
        hidden: c.hidden,
        inter: c.intermediate,
        layers: c.layers,
        patch_dim: c.patch_dim(),
        unit: c.merge_unit(),
        out: c.text_hidden,
        merger_inner: c.merger_inner,
    }
}

fn step_dims(c: &tower_step::StepConfig) -> Dims {
    Dims::Step {
        hidden: c.hidden,
        inter: c.intermediate,
        layers: c.layers,
        patch: c.patch,
        text: c.text_hidden,
    }
}

// ---------------------------------------------------------------------------------------------
// the tables
// ---------------------------------------------------------------------------------------------

/// One case's numbers, both sides.
#[derive(Debug, Clone, Default)]
pub struct Line {
    /// The case's name.
    pub name: String,
    /// The table's label.
    pub label: String,
    /// Images per batch.
    pub batch: usize,
    /// Analytic FLOPs of the case.
    pub flops: f64,
    /// Our median ms (see `ours_note` when there is none).
    pub ours_ms: Option<f64>,
    /// Why `ours_ms` is missing.
    pub ours_note: String,
    /// PyTorch eager SDPA median ms.
    pub eager_ms: Option<f64>,
    /// PyTorch torch.compile median ms.
    pub compile_ms: Option<f64>,
    /// Why `compile_ms` is missing.
    pub compile_note: String,
    /// Rows compared (rows × width).
    pub rows: Option<(usize, usize)>,
    /// rel-L2 of our rows against torch's bf16 rows.
    pub rel_torch_bf16: Option<f64>,
    /// rel-L2 of our rows against the f32 reference.
    pub rel_f32: Option<f64>,
    /// rel-L2 of torch's bf16 rows against the f32 reference (for scale).
    pub torch_rel_f32: Option<f64>,
    /// Our median ms with CUDA graphs off (every kernel launched eagerly); `ours_ms` is with
    /// graphs on (the default: the timed runs replay the layout's graph).
    pub ours_eager_ms: Option<f64>,
    /// Graph replays during the timed runs with graphs on (0: the layout was never replayed).
    pub graph_replays: Option<u64>,
    /// `--profile`: one eager pass, operation by operation (largest first).
    pub profile: Vec<gpu_core::OpTime>,
    /// When our timed runs (with their warm-up) started and ended (Unix seconds).
    pub ours_window: Option<(f64, f64)>,
    /// The same for PyTorch's eager runs (from anchor.json).
    pub eager_window: Option<(f64, f64)>,
    /// The same for PyTorch's torch.compile runs (from anchor.json).
    pub compile_window: Option<(f64, f64)>,
}

fn ms(v: Option<f64>, note: &str) -> String {
    match v {
        Some(v) => format!("{v:.2}"),
        None if note.is_empty() => "—".into(),
        None => note.into(),
    }
}

fn ratio(num: Option<f64>, den: Option<f64>) -> String {
    match (num, den) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "—".into(),
    }
}

fn sci(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_nan() => "NaN".into(),
        Some(v) => format!("{v:.2e}"),
        None => "—".into(),
    }
}

/// The speed table (markdown): case, our ms, eager ms, torch.compile ms, speed-up over each,
/// images/s, achieved TFLOP/s, % of the measured peak, floor ms (the FLOPs at that peak).
pub fn speed_table(lines: &[Line], peak_tflops: Option<f64>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| case | ours ms | eager ms | torch.compile ms | vs eager | vs compile | img/s | TFLOP/s | % of peak | floor ms |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    for l in lines {
        let tf = l.ours_ms.map(|m| l.flops / m / 1e9);
        let ips = l.ours_ms.map(|m| 1e3 * l.batch as f64 / m);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            l.label,
            ms(l.ours_ms, &l.ours_note),
            ms(l.eager_ms, ""),
            ms(l.compile_ms, &l.compile_note),
            ratio(l.eager_ms, l.ours_ms),
            ratio(l.compile_ms, l.ours_ms),
            ips.map_or("—".into(), |v| format!("{v:.1}")),
            tf.map_or("—".into(), |v| format!("{v:.0}")),
            match (tf, peak_tflops) {
                (Some(t), Some(p)) if p > 0.0 => format!("{:.0}%", 100.0 * t / p),
                _ => "—".into(),
            },
            peak_tflops.map_or("—".into(), |p| format!("{:.2}", l.flops / p / 1e9)),
        );
    }
    s
}

/// The accuracy table (markdown): rel-L2 of our rows against torch's bf16 rows and against the
/// f32 reference, torch's own bf16 against f32 for scale, and the verdict at the bf16 bound.
pub fn accuracy_table(lines: &[Line]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| case | rows | ours vs torch bf16 | ours vs f32 | torch bf16 vs f32 | ours ≤ {BF16_BOUND:.0e} vs f32 |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for l in lines {
        let verdict = match l.rel_f32 {
            Some(r) if r <= BF16_BOUND => "PASS",
            Some(_) => "FAIL",
            None => "—",
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {verdict} |",
            l.label,
            l.rows.map_or("—".into(), |(r, w)| format!("{r} × {w}")),
            sci(l.rel_torch_bf16),
            sci(l.rel_f32),
            sci(l.torch_rel_f32),
        );
    }
    s
}

/// GEMM shapes tuned so far on `side`'s device (0 without one).
fn tuned_len(side: &Side) -> usize {
    match side {
        Side::Cuda(d) => d.gemm_tuned().len(),
        _ => 0,
    }
}

/// The GEMM tuning table (markdown): every GEMM shape the towers ran, cuBLASLt's heuristic first
/// answer against the fastest of the candidates it offered, timed on the towers' own buffers.
pub fn tuning_table(tuned: &[(&str, GemmTuned)]) -> String {
    let mut md = String::from(
        "| tower | GEMM m×n×k | +C | candidates | heuristic ms | best ms | kept ms | kept TFLOP/s | heuristic vs best |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for (fam, g) in tuned {
        let s = g.shape;
        let flop = 2.0 * (s.m * s.n * s.k) as f64;
        let tflops = if g.chosen_ms > 0.0 {
            flop / g.chosen_ms as f64 / 1e9
        } else {
            0.0
        };
        let slower = if g.best_ms > 0.0 {
            g.heuristic_ms / g.best_ms
        } else {
            1.0
        };
        let _ = writeln!(
            md,
            "| {fam} | {}×{}×{}{} | {} | {} | {:.4} | {:.4} | {:.4} | {tflops:.0} | {:+.1}% |",
            s.m,
            s.n,
            s.k,
            if g.bf16 { "" } else { " (f32)" },
            if s.accumulate { "yes" } else { "" },
            g.candidates,
            g.heuristic_ms,
            g.best_ms,
            g.chosen_ms,
            (slower - 1.0) * 100.0,
        );
    }
    md
}

/// The graph table (markdown): our forward with CUDA graphs (the default) and without (every
/// kernel launched eagerly), the time the graph saves, and the replays that were timed.
pub fn graph_table(lines: &[Line]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| case | graphs on ms | graphs off (eager) ms | saved ms | saved | replays timed |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for l in lines {
        let saved = match (l.ours_eager_ms, l.ours_ms) {
            (Some(e), Some(g)) => (
                format!("{:.2}", e - g),
                format!("{:.1}%", 100.0 * (e - g) / e),
            ),
            _ => ("—".into(), "—".into()),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            l.label,
            ms(l.ours_ms, &l.ours_note),
            ms(l.ours_eager_ms, ""),
            saved.0,
            saved.1,
            l.graph_replays.map_or("—".into(), |r| r.to_string()),
        );
    }
    s
}

/// The clock table (markdown): each side's SM clock, power-cap share and power during its timed
/// runs (NVML samples of this run; "—" where the window has none, e.g. a reused PyTorch side), our
/// TFLOP/s as a share of the sustained GEMM ceiling, and the energy per image of ours and of
/// torch.compile (the energy counter's power over the window × the median time / images): under a
/// power limit, images/s = watts / (J/image), so the side with fewer joules per image is the one
/// with room left; ours also per FLOP (pJ), to set beside the held GEMM ceiling's.
pub fn clock_table(lines: &[Line], samples: &[Sample], sustained_tflops: Option<f64>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| case | ours: clock during the timed runs | ours % of sustained peak | eager | torch.compile | J/image ours | J/image torch.compile | torch.compile / ours | ours pJ/FLOP |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    let joules = |v: Option<f64>| v.map_or("—".into(), |j| format!("{j:.2}"));
    for l in lines {
        let tf = l.ours_ms.map(|m| l.flops / m / 1e9);
        let j_ours = clocks::window_joules(samples, l.ours_window, l.ours_ms, l.batch);
        let j_compile = clocks::window_joules(samples, l.compile_window, l.compile_ms, l.batch);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            l.label,
            clocks::window_cell(samples, l.ours_window),
            match (tf, sustained_tflops) {
                (Some(t), Some(p)) if p > 0.0 => format!("{:.0}%", 100.0 * t / p),
                _ => "—".into(),
            },
            clocks::window_cell(samples, l.eager_window),
            clocks::window_cell(samples, l.compile_window),
            joules(j_ours),
            joules(j_compile),
            ratio(j_compile, j_ours),
            match j_ours {
                Some(j) if l.flops > 0.0 => format!("{:.2}", j * l.batch as f64 / l.flops * 1e12),
                _ => "—".into(),
            },
        );
    }
    s
}

/// The PyTorch side of this run against the anchors' published run (same shapes, same kind of
/// card): a check that the baseline was reproduced, not weakened.
pub fn anchors_table(lines: &[Line]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| case | eager ms (anchors) | torch.compile ms (anchors) | our ms vs anchors' compile |"
    );
    let _ = writeln!(s, "|---|---|---|---|");
    for l in lines {
        let Some(c) = CASES.iter().find(|c| c.name == l.name) else {
            continue;
        };
        let a = c.anchor;
        let _ = writeln!(
            s,
            "| {} | {} ({:.1}) | {} ({:.1}) | {} |",
            l.label,
            ms(l.eager_ms, ""),
            a.sdpa_ms,
            ms(l.compile_ms, &l.compile_note),
            a.compile_ms,
            ratio(Some(a.compile_ms), l.ours_ms),
        );
    }
    s
}

/// `YYYY-MM-DD` of a day count since 1970-01-01 (proleptic Gregorian; H. Hinnant's algorithm).
pub fn civil_date(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    civil_date(secs.div_euclid(86_400))
}

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
            let l = bt::gemma_cuda(d, &dir)?;
            let dims = gemma_dims(l.tower.config());
            go!((l.tower, l.load_s, l.upload_s, l.weight_bytes), dims, gemma)
        }
        (Family::Glm5Next, Some(d)) => {
            let l = bt::glm_cuda(d, &dir)?;
            let dims = glm_dims(l.tower.config());
            go!((l.tower, l.load_s, l.upload_s, l.weight_bytes), dims, glm)
        }
        (Family::Step3p7, Some(d)) => {
            let l = bt::step_cuda(d, &dir)?;
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
    batch: &T::Batch,
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
        match crate::towers::shared_device() {
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
        "Method: same inputs both sides (saved by `xtask/bench/torch_anchor.py`); CUDA events around forward + projection from device-resident inputs to device-resident rows; warm-up {} runs ({} after torch.compile), then the median of {}; torch.compile default mode over SDPA, one static compile per case. TFLOP/s and floor: analytic FLOPs at the measured gpu-core peak.\n",
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
    md.push_str(&accuracy_table(&lines));
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
        "date": today(), "device": device_name, "nvidia_smi": nvidia_smi(),
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
    print!("{}", accuracy_table(&lines));
    println!();
    print!("{}", graph_table(&lines));
    println!();
    print!("{}", speed_table(&lines, peak));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_flops_reads_profile_labels() {
        assert_eq!(gemm_flops("gemm 2×3×4"), Some(48.0));
        assert_eq!(
            gemm_flops("gemm 41472×8192×1024 +C"),
            Some(2.0 * 41472.0 * 8192.0 * 1024.0)
        );
        assert_eq!(gemm_flops("gemm 2×3×4 f32"), Some(48.0));
        assert_eq!(gemm_flops("rms_norm_bf16 grid 2×1×1 block 256×1"), None);
        assert_eq!(gemm_flops("gemm 2×3"), None);
        assert_eq!(gemm_flops("gemm a×3×4"), None);
    }

    /// Our FLOP count at the anchors' full-size configs reproduces the anchors' published TFLOP/s
    /// from their published ms (both rounded: ms to 0.1, TFLOP/s to 1), SDPA and compile alike.
    #[test]
    fn flops_match_the_anchors_table() {
        for c in &CASES {
            let f = flops(anchor_dims(c.family), c.geometry, c.batch).unwrap();
            for (ms, tf) in [
                (c.anchor.sdpa_ms, c.anchor.sdpa_tflops),
                (c.anchor.compile_ms, c.anchor.compile_tflops),
            ] {
                let lo = f / (ms + 0.05) / 1e9 - 0.5;
                let hi = f / (ms - 0.05) / 1e9 + 0.5;
                assert!(
                    lo <= tf && tf <= hi,
                    "{}: {f:.4e} FLOP in {ms} ms gives {:.1} TFLOP/s, the anchors say {tf}",
                    c.name,
                    f / ms / 1e9
                );
            }
        }
    }

    /// The anchors' floors: "about 15 ms for one step3p7 main view and 34 ms for a 12288-patch
    /// glm5_next image" at their measured 764 TFLOP/s.
    #[test]
    fn floors_match_the_anchors_text() {
        let floor = |name: &str| {
            let c = CASES.iter().find(|c| c.name == name).unwrap();
            flops(anchor_dims(c.family), c.geometry, c.batch).unwrap() / 764.0 / 1e9
        };
        assert!((floor("step_728_b1") - 15.0).abs() < 0.5);
        assert!((floor("glm5_96x128_b1") - 34.0).abs() < 0.5);
    }

    /// The same counts as `torch_anchor.py` at full size (its `flops()` on the configs built on
    /// the meta device, transformers 5.23), to the FLOP.
    #[test]
    fn flops_match_the_pytorch_side() {
        let python: [(&str, u64); 8] = [
            ("gemma4_b1", 3_329_771_010_048),
            ("gemma4_b8", 26_638_168_080_384),
            ("glm5_72_b1", 7_242_123_313_152),
            ("glm5_96x128_b1", 25_747_859_177_472),
            ("glm5_72_b8", 57_936_986_505_216),
            ("step_728_b1", 11_634_513_346_560),
            ("step_504_b6", 30_296_223_645_696),
            ("step_728_b8", 93_076_106_772_480),
        ];
        for (name, want) in python {
            let c = CASES.iter().find(|c| c.name == name).unwrap();
            let got = flops(anchor_dims(c.family), c.geometry, c.batch).unwrap();
            assert_eq!(got, want as f64, "{name}");
        }
    }

    #[test]
    fn flops_refuse_a_geometry_of_another_family() {
        assert!(flops(
            anchor_dims(Family::Step3p7),
            Geometry::Grid { gw: 4, gh: 4 },
            1
        )
        .is_err());
        assert!(flops(anchor_dims(Family::Gemma4), Geometry::Side(728), 1).is_err());
    }

    #[test]
    fn cases_select_by_name_and_family_in_table_order() {
        let names = |s| {
            select_cases(Some(s))
                .unwrap()
                .iter()
                .map(|c| c.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names("step3p7,gemma4_b8"),
            ["gemma4_b8", "step_728_b1", "step_504_b6", "step_728_b8"]
        );
        assert_eq!(select_cases(None).unwrap().len(), 8);
        assert_eq!(select_cases(Some("all")).unwrap().len(), 8);
        assert!(select_cases(Some("gemma5")).is_err());
    }

    #[test]
    fn speed_table_row() {
        let l = Line {
            label: "x".into(),
            batch: 8,
            flops: 4.0e12,
            ours_ms: Some(10.0),
            eager_ms: Some(40.0),
            compile_ms: Some(12.5),
            ..Line::default()
        };
        let t = speed_table(&[l], Some(800.0));
        let row = t.lines().nth(2).unwrap();
        // 4e12 FLOP in 10 ms = 400 TFLOP/s = 50% of 800; floor 4e12 / 800e12 s = 5 ms; 800 img/s
        assert_eq!(
            row,
            "| x | 10.00 | 40.00 | 12.50 | 4.00× | 1.25× | 800.0 | 400 | 50% | 5.00 |"
        );
    }

    #[test]
    fn profile_table_splits_gemm_attention_and_the_rest() {
        let op = |label: &str, ms: f64| gpu_core::OpTime {
            label: label.into(),
            calls: 1,
            ms,
        };
        let l = Line {
            label: "p".into(),
            profile: vec![
                op("gemm 8×8×8", 5.0),
                op("flash_attn_ws_hd64_c3 grid 1×1×1 block 512×1", 3.0),
                op("gated_act_bf16 grid 4×1×1 block 256×1", 1.0),
                op("gemm 8×8×16 +C", 0.25),
                op("gemm_gate_silu_sm90a grid 132×1×1 block 384×1", 0.25),
                op("rms_norm_bf16 grid 2×1×1 block 64×1", 0.25),
                op("gated_act_bf16 grid 8×1×1 block 256×1", 0.25),
            ],
            ..Line::default()
        };
        let t = profile_table(&[l, Line::default()]);
        assert_eq!(t.lines().count(), 3, "{t}");
        assert_eq!(
            t.lines().nth(2).unwrap(),
            "| p | 10.00 | 5.50 (55 %) | 3.00 (30 %) | 1.50 (15 %) | gated_act_bf16 1.25, rms_norm_bf16 0.25 |"
        );
    }

    #[test]
    fn graph_table_row() {
        let l = Line {
            label: "g".into(),
            ours_ms: Some(9.0),
            ours_eager_ms: Some(10.0),
            graph_replays: Some(23),
            ..Line::default()
        };
        let t = graph_table(&[l]);
        assert_eq!(
            t.lines().nth(2).unwrap(),
            "| g | 9.00 | 10.00 | 1.00 | 10.0% | 23 |"
        );
        let none = graph_table(&[Line {
            label: "n".into(),
            ours_note: "failed".into(),
            ..Line::default()
        }]);
        assert_eq!(
            none.lines().nth(2).unwrap(),
            "| n | failed | — | — | — | — |"
        );
    }

    #[test]
    fn clock_table_row_has_joules_per_image() {
        let smp = |t: f64, mj: u64| Sample {
            t,
            sm_mhz: 1600,
            power_w: 690.0,
            reasons: clocks::REASON_SW_POWER_CAP,
            energy_mj: Some(mj),
        };
        // ours: 700 W over [0, 1]; torch.compile: 600 W over [2, 3] (a counter step per 0.1 s)
        let samples: Vec<Sample> = (0..=10)
            .map(|i| smp(0.1 * f64::from(i), 70_000 * i as u64))
            .chain((0..=10).map(|i| smp(2.0 + 0.1 * f64::from(i), 1_000_000 + 60_000 * i as u64)))
            .collect();
        let l = Line {
            label: "c".into(),
            batch: 8,
            flops: 8e12,
            ours_ms: Some(100.0),
            compile_ms: Some(160.0),
            ours_window: Some((0.0, 1.0)),
            compile_window: Some((2.0, 3.0)),
            ..Line::default()
        };
        let t = clock_table(&[l], &samples, Some(100.0));
        // ours 700 W × 0.1 s / 8 = 8.75 J; compile 600 W × 0.16 s / 8 = 12 J
        assert_eq!(
            t.lines().nth(2).unwrap(),
            "| c | 1600 MHz (min 1600), capped 100 %, 700 W | 80% | — | 1600 MHz (min 1600), capped 100 %, 600 W | 8.75 | 12.00 | 1.37× | 8.75 |"
        );
    }

    #[test]
    fn speed_table_without_our_number_keeps_the_floor_and_the_note() {
        let l = Line {
            label: "s".into(),
            batch: 1,
            flops: 1.6e12,
            ours_note: "no device".into(),
            eager_ms: Some(38.0),
            compile_note: "skipped".into(),
            ..Line::default()
        };
        let row = speed_table(&[l], Some(800.0))
            .lines()
            .nth(2)
            .unwrap()
            .to_string();
        assert_eq!(
            row,
            "| s | no device | 38.00 | skipped | — | — | — | — | — | 2.00 |"
        );
    }

    #[test]
    fn accuracy_table_verdicts() {
        let mk = |r: f64| Line {
            label: "a".into(),
            rows: Some((266, 5376)),
            rel_f32: Some(r),
            ..Line::default()
        };
        let t = accuracy_table(&[mk(3.2e-3), mk(0.5), mk(f64::NAN)]);
        let rows: Vec<&str> = t.lines().skip(2).collect();
        assert!(rows[0].ends_with("| PASS |") && rows[0].contains("266 × 5376"));
        assert!(rows[1].ends_with("| FAIL |"));
        assert!(rows[2].ends_with("| FAIL |") && rows[2].contains("NaN"));
    }

    #[test]
    fn rel_l2_basics() {
        assert_eq!(rel_l2(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((rel_l2(&[0.0, 0.0], &[3.0, 4.0]) - 1.0).abs() < 1e-12);
        assert!(rel_l2(&[1.0], &[1.0, 2.0]).is_infinite());
        assert!(rel_l2(&[f32::NAN], &[1.0]).is_nan());
    }

    /// Day counts from Python's `datetime.date` (days since 1970-01-01).
    #[test]
    fn civil_dates() {
        for (days, date) in [
            (0, "1970-01-01"),
            (11016, "2000-02-29"),
            (11017, "2000-03-01"),
            (20786, "2026-11-29"),
            (47541, "2100-03-01"),
            (-1, "1969-12-31"),
        ] {
            assert_eq!(civil_date(days), date);
        }
    }

    #[test]
    fn geometry_from_anchor_json() {
        let a = json!({"cases": {"gemma4_b1": {"geometry": {"gw": 6, "gh": 9}},
                                  "step_728_b1": {"geometry": {"side": 168}},
                                  "glm5_72_b1": {"geometry": {"gh": 8}}}});
        let c = |n| CASES.iter().find(|c| c.name == n).unwrap();
        assert_eq!(
            case_geometry(&a, c("gemma4_b1")).unwrap(),
            Some(Geometry::Grid { gw: 6, gh: 9 })
        );
        assert_eq!(
            case_geometry(&a, c("step_728_b1")).unwrap(),
            Some(Geometry::Side(168))
        );
        assert!(case_geometry(&a, c("glm5_72_b1")).is_err());
        assert_eq!(case_geometry(&a, c("gemma4_b8")).unwrap(), None);
    }
}
