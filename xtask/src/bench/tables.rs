//! The bench's tables and report: speed, accuracy, GEMM tuning, graphs, clocks, anchors.

use super::*;

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

pub(super) fn ms(v: Option<f64>, note: &str) -> String {
    match v {
        Some(v) => format!("{v:.2}"),
        None if note.is_empty() => "—".into(),
        None => note.into(),
    }
}

pub(super) fn ratio(num: Option<f64>, den: Option<f64>) -> String {
    match (num, den) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "—".into(),
    }
}

pub(super) fn sci(v: Option<f64>) -> String {
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

/// The accuracy table (markdown): rel-L2 of our rows (in `precision`) against torch's bf16 rows and
/// against the f32 reference, torch's own bf16 against f32 for scale, and the verdict at the
/// 16-bit bound. In f16 a last column gives issue 39's ship gate: our f16 rows no further from f32
/// than torch's own bf16.
pub fn accuracy_table(lines: &[Line], precision: Precision) -> String {
    let mut s = String::new();
    let f16 = precision == Precision::F16;
    let _ = writeln!(
        s,
        "| case | rows | ours ({precision}) vs torch bf16 | ours ({precision}) vs f32 | torch bf16 vs f32 | ours ≤ {BF16_BOUND:.0e} vs f32 |{}",
        if f16 { " f16 gate: ours ≤ torch bf16 vs f32 |" } else { "" }
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|{}",
        if f16 { "---|" } else { "" }
    );
    for l in lines {
        let verdict = match l.rel_f32 {
            Some(r) if r <= BF16_BOUND => "PASS",
            Some(_) => "FAIL",
            None => "—",
        };
        let gate = match (l.rel_f32, l.torch_rel_f32) {
            _ if !f16 => String::new(),
            (Some(r), Some(t)) if r <= t => " PASS |".into(),
            (Some(_), Some(_)) => " FAIL |".into(),
            _ => " — |".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {verdict} |{gate}",
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
pub(super) fn tuned_len(side: &Side) -> usize {
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

pub(super) fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    civil_date(secs.div_euclid(86_400))
}
