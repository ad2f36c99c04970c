//! The tower paths `cargo xtask parity` runs: each family's host reference (and, on a CUDA
//! machine, its device paths) wrapped as a [`Runner`].

use crate::parity_case::{inputs_case, Arith, Case, CaseRunner, Outcome, Runner};
use crate::parity_device::shared_device;
use anyhow::{bail, Context, Result};
use gpu_core::DeviceTower;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tower_gemma::cuda::Device;
use tower_gemma::{forward_host, GemmaImage, GemmaStages, GemmaTower, GgufActivation};

/// The Gemma-4 runner for a (variants, source, precision) slot of the table, if it is gemma4's.
pub fn runner(
    variants: &'static [&'static str],
    source: &'static str,
    precision: Arith,
) -> Option<Box<dyn Runner>> {
    let gemma = variants.iter().all(|v| v.starts_with("gemma4"));
    match (gemma, precision) {
        (true, Arith::HostF32) => Some(Box::new(CaseRunner {
            variants,
            source,
            precision,
            run: move |f: &Path, c: &Case| GemmaHost { variants, source }.run_case(f, c),
        })),
        (true, Arith::Cuda(_)) => Some(Box::new(GemmaCudaRunner {
            host: GemmaHost { variants, source },
            precision,
        })),
        _ => None,
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

/// The Gemma-4 CUDA path (`cuda-f32`, `cuda-bf16`) on one weight source; "not run" without CUDA,
/// failed when the device does not open.
struct GemmaCudaRunner {
    host: GemmaHost,
    precision: Arith,
}

impl GemmaCudaRunner {
    fn run_case(
        &self,
        dev: Arc<Device>,
        fixtures: &Path,
        case: &Case,
    ) -> Result<BTreeMap<String, Vec<f64>>> {
        let tower = self.host.open(fixtures, &case.variant)?;
        let p = self.precision.precision();
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
    fn precision(&self) -> Arith {
        self.precision
    }
    fn applies(&self, variant: &str) -> bool {
        self.host.variants.contains(&variant)
    }
    fn run(&self, fixtures: &Path, case: &Case) -> Outcome {
        let dev = match shared_device() {
            Ok(d) => d,
            Err(no) => return no.outcome(),
        };
        match self.run_case(dev, fixtures, case) {
            Ok(m) => Outcome::Ran(m),
            Err(e) => Outcome::Error(format!("{e:#}")),
        }
    }
}
