//! The vocabulary of `cargo xtask parity` that the tower runners (`towers*.rs`) share with the
//! table (`parity.rs`): precisions and their bounds, the rel-L2 verdict, fixture cases, and the
//! [`Runner`] a path implements. Below both, so neither imports the other's module.
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
pub use vision_towers::tower_core::rel_l2;
pub use vision_towers::Precision;

// ---------------------------------------------------------------------------------------------
// precision, bounds, verdict
// ---------------------------------------------------------------------------------------------

/// Where a parity path runs and in which [`Precision`]: the host's f32 reference twin, or the
/// CUDA kernels in a precision. The table's precision column and its bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arith {
    /// Host (CPU) float32 reference twin.
    HostF32,
    /// CUDA kernels in this precision.
    Cuda(Precision),
}

impl Arith {
    /// Every path, in table order.
    pub const ALL: [Arith; 4] = [
        Arith::HostF32,
        Arith::Cuda(Precision::F32),
        Arith::Cuda(Precision::Bf16),
        Arith::Cuda(Precision::F16),
    ];

    /// Largest rel-L2 against the float64 oracle that passes.
    pub fn bound(self) -> f64 {
        match self {
            Arith::HostF32 => 1e-5,
            Arith::Cuda(Precision::F32) => 1e-4,
            // f16 carries 3 more mantissa bits than bf16 but a range of ±65504 only: bf16's
            // bound, and non-finite rows are an error of the tower (never a pass).
            Arith::Cuda(Precision::Bf16 | Precision::F16) => 2e-2,
        }
    }

    /// The precision the tower runs in.
    pub fn precision(self) -> Precision {
        match self {
            Arith::HostF32 => Precision::F32,
            Arith::Cuda(p) => p,
        }
    }
}

impl fmt::Display for Arith {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arith::HostF32 => f.write_str("host-f32"),
            Arith::Cuda(p) => write!(f, "cuda-{p}"),
        }
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
    /// The device's GPU tier refuses this precision by design (bf16 on Turing's 7.5 tier, which has
    /// no bf16 tensor cores; f16 runs on every tier): neither a pass nor a failure, counted apart,
    /// with the tier named.
    Refused,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::NotImplemented => "not implemented",
            Verdict::NotRun => "not run",
            Verdict::Refused => "refused (tier)",
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
    fn precision(&self) -> Arith;
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
    pub precision: Arith,
    /// The case → stage activations function.
    pub run: F,
}

impl<F: Fn(&Path, &Case) -> Result<BTreeMap<String, Vec<f64>>>> Runner for CaseRunner<F> {
    fn source(&self) -> &str {
        self.source
    }
    fn precision(&self) -> Arith {
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

/// The case whose processor tensors feed `case` (`meta.inputs`: `self`, or a path under
/// `fixtures/` such as `outputs/gemma4/tiny_20x15.safetensors`).
pub fn inputs_case(fixtures: &Path, case: &Case) -> Result<Case> {
    match case.meta.get("inputs").and_then(Value::as_str) {
        None | Some("self") => Case::open(&case.path),
        Some(other) => Case::open(&fixtures.join(other)),
    }
}
