//! `cargo xtask parity`: run every available path against every oracle fixture and print one
//! table (variant, source, case, stage, precision, rel-L2 vs the float64 reference, bound,
//! verdict). Exits non-zero on any failure; "not implemented" is not a failure (and never a pass).
//!
//! A tower plugs in by implementing [`Runner`] and adding it to [`runners`]: given a fixture
//! case it returns the named stage activations (`patch_embed`, `block_0`, …, `rows`, the names
//! in the case's `stages` metadata) or [`Outcome::NotImplemented`].
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// precision, bounds, verdict
// ---------------------------------------------------------------------------------------------

/// The arithmetic a path runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Host (CPU) float32 reference twin.
    HostF32,
    /// CUDA kernels in float32.
    CudaF32,
    /// CUDA kernels with bfloat16 weights/activations.
    CudaBf16,
}

impl Precision {
    /// Every precision, in table order.
    pub const ALL: [Precision; 3] = [Precision::HostF32, Precision::CudaF32, Precision::CudaBf16];

    /// Largest rel-L2 against the float64 oracle that passes.
    pub fn bound(self) -> f64 {
        match self {
            Precision::HostF32 => 1e-5,
            Precision::CudaF32 => 1e-4,
            Precision::CudaBf16 => 2e-2,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::HostF32 => "host-f32",
            Precision::CudaF32 => "cuda-f32",
            Precision::CudaBf16 => "cuda-bf16",
        })
    }
}

/// `‖out − ref‖₂ / ‖ref‖₂`, accumulated in f64. A zero reference gives `‖out‖₂`. Any NaN gives NaN;
/// a length mismatch gives +∞.
pub fn rel_l2(out: &[f64], reference: &[f64]) -> f64 {
    if out.len() != reference.len() {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&o, &r) in out.iter().zip(reference) {
        num += (o - r) * (o - r);
        den += r * r;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// The verdict of one table row.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// rel-L2 is finite and within the bound.
    Pass,
    /// Over the bound, NaN, infinite, or the path errored.
    Fail,
    /// The path does not exist yet.
    NotImplemented,
    /// The path exists but needs hardware this machine lacks (a CUDA path without a device):
    /// neither a pass nor a failure, counted apart.
    NotRun,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::NotImplemented => "not implemented",
            Verdict::NotRun => "not run",
        })
    }
}

/// Pass only for a finite rel-L2 at or under the bound (so NaN never passes).
pub fn verdict(rel: f64, bound: f64) -> Verdict {
    if rel.is_finite() && rel <= bound {
        Verdict::Pass
    } else {
        Verdict::Fail
    }
}

// ---------------------------------------------------------------------------------------------
// fixture cases (minimal safetensors reader: 8-byte LE header length + JSON header + data)
// ---------------------------------------------------------------------------------------------

/// One tensor of a fixture file, converted to f64.
#[derive(Clone, Debug)]
pub struct Tensor {
    /// Shape as stored.
    pub shape: Vec<usize>,
    /// Row-major values.
    pub data: Vec<f64>,
}

/// A fixture file under `fixtures/outputs/<variant>/<case>.safetensors`.
#[derive(Debug)]
pub struct Case {
    /// Variant directory, e.g. `gemma4_clipped`.
    pub variant: String,
    /// File stem, e.g. `batch2`.
    pub name: String,
    /// The file.
    pub path: PathBuf,
    /// The `fixture` metadata JSON (kind, images, model, stages, prompt_plan, …).
    pub meta: Value,
    header: serde_json::Map<String, Value>,
    bytes: Vec<u8>,
}

impl Case {
    /// Reads and parses one fixture file.
    pub fn open(path: &Path) -> Result<Case> {
        let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        if bytes.len() < 8 {
            bail!("{}: shorter than a safetensors header", path.display());
        }
        let n = u64::from_le_bytes(bytes[..8].try_into()?) as usize;
        let header: Value =
            serde_json::from_slice(bytes.get(8..8 + n).context("header past end of file")?)
                .with_context(|| format!("{}: header is not JSON", path.display()))?;
        let mut header = header
            .as_object()
            .context("header is not a JSON object")?
            .clone();
        let meta = header
            .remove("__metadata__")
            .and_then(|m| m.get("fixture").and_then(Value::as_str).map(str::to_owned))
            .map(|s| serde_json::from_str(&s))
            .transpose()?
            .unwrap_or(Value::Null);
        let variant = path
            .parent()
            .and_then(Path::file_name)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let bytes = bytes[8 + n..].to_vec();
        Ok(Case {
            variant,
            name,
            path: path.to_path_buf(),
            meta,
            header,
            bytes,
        })
    }

    /// `tower` or `processor`.
    pub fn kind(&self) -> &str {
        self.meta.get("kind").and_then(Value::as_str).unwrap_or("")
    }

    /// The stage names this case holds references for (`f64/<stage>`).
    pub fn stages(&self) -> Vec<String> {
        self.meta
            .get("stages")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// One tensor by name, converted to f64.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let info = self
            .header
            .get(name)
            .with_context(|| format!("{}: no tensor `{name}`", self.path.display()))?;
        let dtype = info.get("dtype").and_then(Value::as_str).context("dtype")?;
        let shape: Vec<usize> = info
            .get("shape")
            .and_then(Value::as_array)
            .context("shape")?
            .iter()
            .map(|v| v.as_u64().map(|x| x as usize).context("shape entry"))
            .collect::<Result<_>>()?;
        let off = info
            .get("data_offsets")
            .and_then(Value::as_array)
            .context("data_offsets")?;
        let (a, b) = (
            off[0].as_u64().context("offset")? as usize,
            off[1].as_u64().context("offset")? as usize,
        );
        let raw = self
            .bytes
            .get(a..b)
            .with_context(|| format!("`{name}`: data offsets past end of file"))?;
        let data: Vec<f64> = match dtype {
            "F64" => raw
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            "F32" => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            "BF16" => raw
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16) as f64)
                .collect(),
            "I64" => raw
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            "U8" | "BOOL" => raw.iter().map(|&x| x as f64).collect(),
            other => bail!("`{name}`: dtype {other} not handled by the parity reader"),
        };
        if data.len() != shape.iter().product::<usize>() {
            bail!("`{name}`: {} values for shape {shape:?}", data.len());
        }
        Ok(Tensor { shape, data })
    }
}

/// Every `fixtures/outputs/*/*.safetensors`, sorted; an error when the directory is missing (a
/// parity run that compares nothing must not pass).
pub fn discover(fixtures: &Path) -> Result<Vec<Case>> {
    let mut paths = Vec::new();
    let outputs = fixtures.join("outputs");
    if !outputs.is_dir() {
        bail!(
            "{}: no such directory: the oracle fixtures are missing (set {} or run from a checkout; \
             `cargo xtask fixtures` regenerates them)",
            outputs.display(),
            crate::fixtures::FIXTURES_ENV
        );
    }
    for d in fs::read_dir(&outputs)? {
        let d = d?.path();
        if d.is_dir() {
            for f in fs::read_dir(&d)? {
                let f = f?.path();
                if f.extension().is_some_and(|e| e == "safetensors") {
                    paths.push(f);
                }
            }
        }
    }
    paths.sort();
    paths.iter().map(|p| Case::open(p)).collect()
}

// ---------------------------------------------------------------------------------------------
// runners
// ---------------------------------------------------------------------------------------------

/// What a runner returns for one case.
// `Ran`/`Error` are built by tower runners once they plug in (and by the tests today).
#[cfg_attr(not(test), allow(dead_code))]
pub enum Outcome {
    /// Stage name → activations (row-major, same shape as the reference).
    Ran(BTreeMap<String, Vec<f64>>),
    /// The path is not built yet.
    NotImplemented,
    /// The path exists and errored (counts as a failure).
    Error(String),
    /// The path exists but this machine cannot run it (no CUDA device); the note says why.
    NoDevice(String),
}

/// One path under test: a weight source of a model family at a precision.
pub trait Runner {
    /// Weight source label, e.g. `hf`, `gguf-bf16`, `vendor`, `sharded`, `hf-layout`.
    fn source(&self) -> &str;
    /// Arithmetic.
    fn precision(&self) -> Precision;
    /// Whether this path applies to the fixture variant (e.g. `gemma4`).
    fn applies(&self, variant: &str) -> bool;
    /// Runs the case; the inputs are the case's processor tensors (or those of `meta.inputs`).
    fn run(&self, fixtures: &Path, case: &Case) -> Outcome;
}

/// A runner made of its table slot and a function from a case to its stage activations: the
/// shape every host tower path shares.
pub struct CaseRunner<F> {
    /// Variants the path applies to.
    pub variants: &'static [&'static str],
    /// Weight source label.
    pub source: &'static str,
    /// Arithmetic.
    pub precision: Precision,
    /// The case → stage activations function.
    pub run: F,
}

impl<F: Fn(&Path, &Case) -> Result<BTreeMap<String, Vec<f64>>>> Runner for CaseRunner<F> {
    fn source(&self) -> &str {
        self.source
    }
    fn precision(&self) -> Precision {
        self.precision
    }
    fn applies(&self, variant: &str) -> bool {
        self.variants.contains(&variant)
    }
    fn run(&self, fixtures: &Path, case: &Case) -> Outcome {
        match (self.run)(fixtures, case) {
            Ok(m) => Outcome::Ran(m),
            Err(e) => Outcome::Error(format!("{e:#}")),
        }
    }
}

/// Placeholder for a path that has no implementation yet.
struct Pending {
    variants: &'static [&'static str],
    source: &'static str,
    precision: Precision,
}

impl Runner for Pending {
    fn source(&self) -> &str {
        self.source
    }
    fn precision(&self) -> Precision {
        self.precision
    }
    fn applies(&self, variant: &str) -> bool {
        self.variants.contains(&variant)
    }
    fn run(&self, _: &Path, _: &Case) -> Outcome {
        Outcome::NotImplemented
    }
}

/// Weight sources per variant (the mini repositories under `fixtures/models/`).
const SOURCES: [(&[&str], &str); 8] = [
    (&["gemma4", "gemma4_clipped"], "hf"),
    (&["gemma4", "gemma4_clipped"], "gguf-bf16"),
    (&["gemma4"], "gguf-f16"),
    (&["glm5_next"], "hf"),
    (&["glm_ocr"], "hf"),
    (&["step3p7"], "vendor"),
    (&["step3p7"], "sharded"),
    (&["step3p7"], "hf-layout"),
];

/// The registry. A tower crate replaces the matching `Pending` entry with its runner.
pub fn runners() -> Vec<Box<dyn Runner>> {
    let mut v: Vec<Box<dyn Runner>> = Vec::new();
    for (variants, source) in SOURCES {
        for precision in Precision::ALL {
            match crate::towers::runner(variants, source, precision) {
                Some(r) => v.push(r),
                None => v.push(Box::new(Pending {
                    variants,
                    source,
                    precision,
                })),
            }
        }
    }
    v
}

// ---------------------------------------------------------------------------------------------
// the table
// ---------------------------------------------------------------------------------------------

/// One line of the table.
pub struct Row {
    variant: String,
    source: String,
    case: String,
    stage: String,
    precision: Precision,
    rel: Option<f64>,
    verdict: Verdict,
    note: String,
}

/// Compares one runner's outcome on one case against the float64 references.
pub fn rows_for(runner: &dyn Runner, fixtures: &Path, case: &Case) -> Vec<Row> {
    let row = |stage: &str, rel: Option<f64>, verdict: Verdict, note: String| Row {
        variant: case.variant.clone(),
        source: runner.source().to_string(),
        case: case.name.clone(),
        stage: stage.to_string(),
        precision: runner.precision(),
        rel,
        verdict,
        note,
    };
    match runner.run(fixtures, case) {
        Outcome::NotImplemented => vec![row("*", None, Verdict::NotImplemented, String::new())],
        Outcome::Error(e) => vec![row("*", None, Verdict::Fail, e)],
        Outcome::NoDevice(why) => vec![row("*", None, Verdict::NotRun, why)],
        Outcome::Ran(out) => {
            let bound = runner.precision().bound();
            case.stages()
                .iter()
                .map(
                    |stage| match (out.get(stage), case.tensor(&format!("f64/{stage}"))) {
                        (None, _) => row(
                            stage,
                            None,
                            Verdict::Fail,
                            "stage missing from output".into(),
                        ),
                        (_, Err(e)) => row(stage, None, Verdict::Fail, format!("{e:#}")),
                        (Some(o), Ok(r)) => {
                            let r = unpadded(case, r);
                            let rel = rel_l2(o, &r.data);
                            let note = if o.len() != r.data.len() {
                                format!("length {} vs reference {:?}", o.len(), r.shape)
                            } else {
                                String::new()
                            };
                            row(stage, Some(rel), verdict(rel, bound), note)
                        }
                    },
                )
                .collect()
        }
    }
}

/// gemma4 batches are padded to `max_patches` rows per image; padding rows (positions (−1, −1)
/// in `image_position_ids`) carry no meaning and a padding-free path does not produce them. A
/// reference `[B, P, H]` whose `[B, P]` matches the positions is reduced to its valid rows, in
/// order; any other reference is returned as it is.
fn unpadded(case: &Case, reference: Tensor) -> Tensor {
    let fixtures = crate::fixtures::fixtures_dir();
    let Ok(pos) = inputs_case(&fixtures, case).and_then(|c| c.tensor("image_position_ids")) else {
        return reference;
    };
    let (b, p) = match pos.shape[..] {
        [b, p, 2] => (b, p),
        _ => return reference,
    };
    let h = match reference.shape[..] {
        [rb, rp, h] if rb == b && rp == p => h,
        _ => return reference,
    };
    let mut data = Vec::with_capacity(reference.data.len());
    let mut rows = 0;
    for (i, xy) in pos.data.chunks_exact(2).enumerate() {
        if xy != [-1.0, -1.0] {
            data.extend_from_slice(&reference.data[i * h..(i + 1) * h]);
            rows += 1;
        }
    }
    Tensor {
        shape: vec![rows, h],
        data,
    }
}

/// The case whose processor tensors feed `case` (`meta.inputs`: `self`, or a path under
/// `fixtures/` such as `outputs/gemma4/tiny_20x15.safetensors`).
pub fn inputs_case(fixtures: &Path, case: &Case) -> Result<Case> {
    match case.meta.get("inputs").and_then(Value::as_str) {
        None | Some("self") => Case::open(&case.path),
        Some(other) => Case::open(&fixtures.join(other)),
    }
}

/// Usage of `cargo xtask parity`.
const USAGE: &str = "usage: cargo xtask parity [--require-cuda]";

/// Entry point of `cargo xtask parity [--require-cuda]`.
///
/// Exits non-zero on any failed row. CUDA rows read "not run" only where this machine has no
/// CUDA at all; where CUDA is required (`--require-cuda`, or automatically when a GPU is present)
/// a CUDA row that did not run is a failure too.
pub fn run(args: &[String]) -> Result<()> {
    let mut require_cuda = None;
    for a in args {
        match a.as_str() {
            "--require-cuda" => require_cuda = Some("--require-cuda was given".to_string()),
            other => bail!("unknown argument `{other}`\n{USAGE}"),
        }
    }
    if require_cuda.is_none() && crate::towers::gpu_present() {
        require_cuda = Some(format!(
            "a GPU is present (the CUDA driver reports a device, or {} is set)",
            crate::towers::SIMULATE_GPU_ENV
        ));
    }
    let fixtures = crate::fixtures::fixtures_dir();
    let cases = discover(&fixtures)?;
    let towers: Vec<&Case> = cases.iter().filter(|c| c.kind() == "tower").collect();
    let n_proc = cases.iter().filter(|c| c.kind() == "processor").count();
    if towers.is_empty() {
        bail!(
            "no tower fixture case under {}: nothing to compare",
            fixtures.join("outputs").display()
        );
    }
    println!(
        "fixture cases found: {} ({} tower cases with stage references, {} processor cases) under {}",
        cases.len(),
        towers.len(),
        n_proc,
        fixtures.join("outputs").display()
    );
    let runners = runners();
    let mut rows = Vec::new();
    for case in &towers {
        for r in runners.iter().filter(|r| r.applies(&case.variant)) {
            rows.extend(rows_for(r.as_ref(), &fixtures, case));
        }
    }
    print_table(&rows);
    let count = |v: Verdict| rows.iter().filter(|r| r.verdict == v).count();
    let (pass, fail, ni, nr) = (
        count(Verdict::Pass),
        count(Verdict::Fail),
        count(Verdict::NotImplemented),
        count(Verdict::NotRun),
    );
    println!("\n{pass} pass, {fail} fail, {ni} not implemented, {nr} not run (no device)");
    judge(&rows, require_cuda.as_deref())
}

/// The command's verdict over the table: an error when a row failed, or when `require_cuda`
/// (why CUDA is required) is given and a CUDA row did not run (not run, or not implemented).
fn judge(rows: &[Row], require_cuda: Option<&str>) -> Result<()> {
    let fail = rows.iter().filter(|r| r.verdict == Verdict::Fail).count();
    if fail > 0 {
        bail!("{fail} parity rows failed");
    }
    if let Some(why) = require_cuda {
        let idle: Vec<&Row> = rows
            .iter()
            .filter(|r| r.precision != Precision::HostF32)
            .filter(|r| matches!(r.verdict, Verdict::NotRun | Verdict::NotImplemented))
            .collect();
        if let Some(first) = idle.first() {
            let note = if first.note.is_empty() {
                first.verdict.to_string()
            } else {
                first.note.clone()
            };
            bail!(
                "{} CUDA parity rows did not run ({note}) and CUDA is required: {why}",
                idle.len()
            );
        }
    }
    Ok(())
}

fn print_table(rows: &[Row]) {
    let head = [
        "variant",
        "source",
        "case",
        "stage",
        "precision",
        "rel-L2",
        "bound",
        "verdict",
    ];
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            [
                r.variant.clone(),
                r.source.clone(),
                r.case.clone(),
                r.stage.clone(),
                r.precision.to_string(),
                r.rel.map_or("-".into(), |x| format!("{x:.2e}")),
                format!("{:.0e}", r.precision.bound()),
                if r.note.is_empty() {
                    r.verdict.to_string()
                } else {
                    format!("{} ({})", r.verdict, r.note)
                },
            ]
        })
        .collect();
    let mut w = head.map(str::len);
    for c in &cells {
        for (i, s) in c.iter().enumerate() {
            w[i] = w[i].max(s.len());
        }
    }
    let line = |c: &[String]| {
        c.iter()
            .enumerate()
            .map(|(i, s)| format!("{s:<width$}", width = w[i]))
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!("{}", line(&head.map(String::from)));
    println!(
        "{}",
        w.iter()
            .map(|&n| "-".repeat(n))
            .collect::<Vec<_>>()
            .join("  ")
    );
    for c in &cells {
        println!("{}", line(c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rel_l2_hand_derived() {
        // ref = (3, 4): ‖ref‖ = 5; out − ref = (0, 0.5): ‖·‖ = 0.5 → 0.1
        assert!((rel_l2(&[3.0, 4.5], &[3.0, 4.0]) - 0.1).abs() < 1e-15);
        // ref = (1, 2, 2): ‖ref‖ = 3; out − ref = (0, 0, 6e-6) → 2e-6
        assert!((rel_l2(&[1.0, 2.0, 2.000006], &[1.0, 2.0, 2.0]) - 2e-6).abs() < 1e-12);
        assert_eq!(rel_l2(&[1.0], &[1.0, 2.0]), f64::INFINITY);
        assert_eq!(rel_l2(&[0.0, 0.0], &[0.0, 0.0]), 0.0);
    }

    #[test]
    fn verdict_against_bounds() {
        let r = rel_l2(&[1.0, 2.0, 2.000006], &[1.0, 2.0, 2.0]); // 2e-6
        assert_eq!(verdict(r, Precision::HostF32.bound()), Verdict::Pass);
        let r = rel_l2(&[3.0, 4.5], &[3.0, 4.0]); // 0.1
        assert_eq!(verdict(r, Precision::CudaBf16.bound()), Verdict::Fail);
        let r = rel_l2(&[3.0, 4.05], &[3.0, 4.0]); // 0.01
        assert_eq!(verdict(r, Precision::CudaBf16.bound()), Verdict::Pass);
        assert_eq!(verdict(r, Precision::CudaF32.bound()), Verdict::Fail);
    }

    #[test]
    fn nan_never_passes() {
        let r = rel_l2(&[f64::NAN, 4.0], &[3.0, 4.0]);
        assert!(r.is_nan());
        assert_eq!(verdict(r, f64::INFINITY), Verdict::Fail);
        assert_eq!(verdict(f64::INFINITY, f64::INFINITY), Verdict::Fail);
    }

    #[test]
    fn not_implemented_is_neither_pass_nor_fail() {
        let fixtures = crate::fixtures::fixtures_dir();
        let cases = discover(&fixtures).unwrap();
        let case = cases
            .iter()
            .find(|c| c.kind() == "tower")
            .expect("a tower fixture");
        let pending = Pending {
            variants: &["gemma4"],
            source: "hf",
            precision: Precision::CudaF32,
        };
        let rows = rows_for(&pending, &fixtures, case);
        assert!(rows.iter().all(|r| r.verdict == Verdict::NotImplemented));
    }

    #[test]
    fn no_device_is_not_run_neither_pass_nor_fail() {
        struct Absent;
        impl Runner for Absent {
            fn source(&self) -> &str {
                "hf"
            }
            fn precision(&self) -> Precision {
                Precision::CudaBf16
            }
            fn applies(&self, _: &str) -> bool {
                true
            }
            fn run(&self, _: &Path, _: &Case) -> Outcome {
                Outcome::NoDevice("no device".into())
            }
        }
        let fixtures = crate::fixtures::fixtures_dir();
        let cases = discover(&fixtures).unwrap();
        let case = cases
            .iter()
            .find(|c| c.kind() == "tower")
            .expect("a tower fixture");
        let rows = rows_for(&Absent, &fixtures, case);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].verdict, Verdict::NotRun);
        assert_eq!(rows[0].note, "no device");
        assert_eq!(Verdict::NotRun.to_string(), "not run");
    }

    /// A CUDA path whose device did not open for the reason `self.0`, as the tower runners report it.
    struct Unopened(crate::towers::NoCuda, Precision);
    impl Runner for Unopened {
        fn source(&self) -> &str {
            "hf"
        }
        fn precision(&self) -> Precision {
            self.1
        }
        fn applies(&self, _: &str) -> bool {
            true
        }
        fn run(&self, _: &Path, _: &Case) -> Outcome {
            self.0.outcome()
        }
    }

    fn a_tower_case() -> (PathBuf, Case) {
        let fixtures = crate::fixtures::fixtures_dir();
        let case = discover(&fixtures)
            .unwrap()
            .into_iter()
            .find(|c| c.kind() == "tower")
            .expect("a tower fixture");
        (fixtures, case)
    }

    /// A CUDA stack that is installed but broken (here: a PTX module that cannot be read, as with
    /// an invalid `GPU_CORE_PTX_DIR`) fails every CUDA row with the reason, and the command fails,
    /// with or without `--require-cuda`. Only gpu-core's `NoDevice` reads "not run".
    #[test]
    fn a_device_that_does_not_open_fails_every_cuda_row() {
        use crate::towers::{classify, NoCuda};
        use gpu_core::GpuError;
        let (fixtures, case) = a_tower_case();
        for err in [
            GpuError::Ptx {
                module: "act",
                what: "reading /nonexistent/act.ptx: No such file or directory".into(),
            },
            GpuError::Unusable("the CUDA driver panicked while creating a context".into()),
            GpuError::OutOfMemory { bytes: 32 << 20 },
        ] {
            let what = err.to_string();
            let no = classify(Err(err)).expect_err("nothing opened");
            assert!(matches!(no, NoCuda::Broken(_)), "{what}: {no:?}");
            for p in [Precision::CudaF32, Precision::CudaBf16] {
                let rows = rows_for(&Unopened(no.clone(), p), &fixtures, &case);
                assert!(!rows.is_empty());
                for r in &rows {
                    assert_eq!(r.verdict, Verdict::Fail, "{what}");
                    assert!(r.note.contains(&what), "{} lacks {what}", r.note);
                }
                assert!(judge(&rows, None).is_err(), "{what}");
            }
        }
    }

    /// No CUDA at all is "not run" and passes, unless CUDA is required: then every CUDA row that
    /// did not run fails the command, which says why.
    #[test]
    fn require_cuda_fails_when_a_cuda_row_did_not_run() {
        use crate::towers::{classify, NoCuda};
        let (fixtures, case) = a_tower_case();
        let no = classify(Err(gpu_core::GpuError::NoDevice(
            "the CUDA driver library (libcuda.so.1) is not installed".into(),
        )))
        .expect_err("nothing opened");
        assert!(matches!(no, NoCuda::Absent(_)));
        let mut rows = rows_for(&Unopened(no, Precision::CudaBf16), &fixtures, &case);
        assert!(rows.iter().all(|r| r.verdict == Verdict::NotRun));
        assert!(judge(&rows, None).is_ok());
        let err = judge(&rows, Some("--require-cuda was given")).expect_err("required");
        let msg = format!("{err:#}");
        assert!(msg.contains("--require-cuda was given"), "{msg}");
        assert!(msg.contains("libcuda.so.1"), "{msg}");
        // a CUDA path that does not exist yet did not run either
        let pending = Pending {
            variants: &["gemma4"],
            source: "hf",
            precision: Precision::CudaF32,
        };
        let ni = rows_for(&pending, &fixtures, &case);
        assert!(judge(&ni, Some("a GPU is present")).is_err());
        // host rows are never required to be CUDA rows
        let host = Pending {
            variants: &["gemma4"],
            source: "hf",
            precision: Precision::HostF32,
        };
        rows = rows_for(&host, &fixtures, &case);
        assert!(judge(&rows, Some("--require-cuda was given")).is_ok());
    }

    /// Missing fixtures are an error naming the directory, never an empty table that passes.
    #[test]
    fn missing_fixtures_are_an_error_not_a_pass() {
        let err = discover(Path::new("/nonexistent/fixtures")).expect_err("missing");
        let msg = format!("{err:#}");
        assert!(msg.contains("/nonexistent/fixtures/outputs"), "{msg}");
        assert!(msg.contains("fixtures are missing"), "{msg}");
    }

    #[test]
    fn parity_refuses_unknown_arguments() {
        let err = run(&["--require-gpu".to_string()]).expect_err("unknown");
        assert!(format!("{err:#}").contains("--require-cuda"));
    }

    /// A runner that echoes the f64 reference passes every stage at every precision; the f32
    /// upstream activations pass the host-f32 bound (sanity of the fixture files themselves).
    #[test]
    fn fixture_references_are_consistent() {
        struct Echo(&'static str);
        impl Runner for Echo {
            fn source(&self) -> &str {
                "echo"
            }
            fn precision(&self) -> Precision {
                Precision::HostF32
            }
            fn applies(&self, _: &str) -> bool {
                true
            }
            fn run(&self, _: &Path, case: &Case) -> Outcome {
                let mut m = BTreeMap::new();
                for s in case.stages() {
                    match case.tensor(&format!("{}/{s}", self.0)) {
                        Ok(t) => m.insert(s, unpadded(case, t).data),
                        Err(e) => return Outcome::Error(format!("{e:#}")),
                    };
                }
                Outcome::Ran(m)
            }
        }
        let fixtures = crate::fixtures::fixtures_dir();
        let cases = discover(&fixtures).unwrap();
        let towers: Vec<_> = cases.iter().filter(|c| c.kind() == "tower").collect();
        assert!(towers.len() >= 8, "found {} tower cases", towers.len());
        for case in towers {
            for prec in ["f64", "f32"] {
                for row in rows_for(&Echo(prec), &fixtures, case) {
                    assert_eq!(
                        row.verdict,
                        Verdict::Pass,
                        "{}/{} {} {prec}: {:?} {}",
                        case.variant,
                        case.name,
                        row.stage,
                        row.rel,
                        row.note
                    );
                }
            }
        }
    }
}
