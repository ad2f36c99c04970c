//! The tower paths `cargo xtask parity` runs: each family's host reference (and, on a CUDA
//! machine, its device paths) wrapped as a [`Runner`].

use crate::parity::{inputs_case, Case, CaseRunner, Outcome, Precision, Runner};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use tower_gemma::cuda::{CudaPrecision, Device, GpuError};
use tower_gemma::{forward_host, GemmaImage, GemmaStages, GemmaTower, GgufActivation};

/// The implemented runner for a (variants, source, precision) slot of the table, if any.
pub fn runner(
    variants: &'static [&'static str],
    source: &'static str,
    precision: Precision,
) -> Option<Box<dyn Runner>> {
    let gemma = variants.iter().all(|v| v.starts_with("gemma4"));
    match (gemma, precision) {
        (true, Precision::HostF32) => Some(Box::new(CaseRunner {
            variants,
            source,
            precision,
            run: move |f: &Path, c: &Case| GemmaHost { variants, source }.run_case(f, c),
        })),
        (true, Precision::CudaF32 | Precision::CudaBf16) => Some(Box::new(GemmaCudaRunner {
            host: GemmaHost { variants, source },
            precision,
        })),
        _ => crate::towers_glm::runner(variants, source, precision)
            .or_else(|| crate::towers_step::runner(variants, source, precision)),
    }
}

/// The Gemma-4 host reference on one weight source (`hf`, `gguf-bf16`, `gguf-f16`).
struct GemmaHost {
    variants: &'static [&'static str],
    source: &'static str,
}

impl GemmaHost {
    /// The weight file of this source for a variant's mini repository.
    fn weights(&self, fixtures: &Path, variant: &str) -> Result<PathBuf> {
        let clipped = variant == "gemma4_clipped";
        Ok(match (self.source, clipped) {
            ("hf", _) => fixtures.join("models").join(variant),
            ("gguf-bf16", false) => fixtures.join("models/gemma4_gguf/mmproj-BF16.gguf"),
            ("gguf-bf16", true) => fixtures.join("models/gemma4_gguf/mmproj-clipped-BF16.gguf"),
            ("gguf-f16", false) => fixtures.join("models/gemma4_gguf/mmproj-F16.gguf"),
            (other, _) => bail!("no {other} weights for {variant}"),
        })
    }

    fn open(&self, fixtures: &Path, variant: &str) -> Result<GemmaTower> {
        let path = self.weights(fixtures, variant)?;
        if self.source == "hf" {
            let ck =
                st_reader::Checkpoint::open(&path).with_context(|| path.display().to_string())?;
            Ok(GemmaTower::from_checkpoint(&ck)?)
        } else {
            let g =
                gguf_reader::GgufFile::open(&path).with_context(|| path.display().to_string())?;
            Ok(GemmaTower::from_gguf(&g, GgufActivation::Model)?)
        }
    }

    fn run_case(&self, fixtures: &Path, case: &Case) -> Result<BTreeMap<String, Vec<f64>>> {
        let tower = self.open(fixtures, &case.variant)?;
        gemma_inputs(fixtures, case, |images| {
            let (_, stages) = forward_host(&tower.config, &tower.weights, images, true)?;
            Ok(stage_map(stages.context("stages were requested")?))
        })
    }
}

/// Calls `f` with the case's images (pixel rows and positions; padding rows included).
fn gemma_inputs<T>(
    fixtures: &Path,
    case: &Case,
    f: impl FnOnce(&[GemmaImage<'_>]) -> Result<T>,
) -> Result<T> {
    let inputs = inputs_case(fixtures, case)?;
    let pv = inputs.tensor("pixel_values")?;
    let pos = inputs.tensor("image_position_ids")?;
    let (b, p, d) = match pv.shape[..] {
        [b, p, d] => (b, p, d),
        _ => bail!("pixel_values shape {:?}", pv.shape),
    };
    let pv32: Vec<f32> = pv.data.iter().map(|&v| v as f32).collect();
    let pos64: Vec<i64> = pos.data.iter().map(|&v| v as i64).collect();
    let images: Vec<GemmaImage<'_>> = (0..b)
        .map(|i| GemmaImage {
            patches: &pv32[i * p * d..(i + 1) * p * d],
            positions: &pos64[i * p * 2..(i + 1) * p * 2],
        })
        .collect();
    f(&images)
}

/// The stage activations by the names the fixtures use, in f64.
fn stage_map(s: GemmaStages) -> BTreeMap<String, Vec<f64>> {
    let all = [
        ("patch_embed", s.patch_embed),
        ("block_0", s.block_0),
        ("blocks_out", s.blocks_out),
        ("pooled", s.pooled),
        ("standardized", s.standardized),
        ("rows", s.rows),
    ];
    all.into_iter()
        .map(|(k, v)| (k.to_string(), v.into_iter().map(f64::from).collect()))
        .collect()
}

/// One CUDA device for every CUDA runner of the process (gemma and glm alike), opened on first use; the error text
/// (e.g. no driver) when there is none.
pub(crate) fn shared_device() -> std::result::Result<Arc<Device>, String> {
    static DEV: OnceLock<std::result::Result<Arc<Device>, String>> = OnceLock::new();
    DEV.get_or_init(|| match Device::new(0) {
        Ok(d) => Ok(Arc::new(d)),
        Err(GpuError::NoDevice(why)) => Err(format!("no device: {why}")),
        Err(e) => Err(format!("no device: {e}")),
    })
    .clone()
}

/// The Gemma-4 CUDA path (`cuda-f32`, `cuda-bf16`) on one weight source; "not run" without a device.
struct GemmaCudaRunner {
    host: GemmaHost,
    precision: Precision,
}

impl GemmaCudaRunner {
    fn run_case(
        &self,
        dev: Arc<Device>,
        fixtures: &Path,
        case: &Case,
    ) -> Result<BTreeMap<String, Vec<f64>>> {
        let tower = self.host.open(fixtures, &case.variant)?;
        let p = match self.precision {
            Precision::CudaF32 => CudaPrecision::F32,
            _ => CudaPrecision::Bf16,
        };
        let mut cuda = tower.to_cuda(dev, p)?;
        gemma_inputs(fixtures, case, |images| {
            let (_, stages) = cuda.encode(images, true)?;
            Ok(stage_map(stages.context("stages were requested")?))
        })
    }
}

impl Runner for GemmaCudaRunner {
    fn source(&self) -> &str {
        self.host.source
    }
    fn precision(&self) -> Precision {
        self.precision
    }
    fn applies(&self, variant: &str) -> bool {
        self.host.variants.contains(&variant)
    }
    fn run(&self, fixtures: &Path, case: &Case) -> Outcome {
        let dev = match shared_device() {
            Ok(d) => d,
            Err(why) => return Outcome::NoDevice(why),
        };
        match self.run_case(dev, fixtures, case) {
            Ok(m) => Outcome::Ran(m),
            Err(e) => Outcome::Error(format!("{e:#}")),
        }
    }
}
