//! The glm towers' parity runners: the `tower-glm5` host reference for `glm5_next` and
//! `glm_ocr` from their HF mini repositories, and (on a CUDA machine) the `GlmCuda` path in
//! both precisions.

use crate::parity_case::{inputs_case, Arith, Case, CaseRunner, Outcome, Runner};
use anyhow::{bail, Context, Result};
use gpu_core::DeviceTower;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use tower_glm5::cuda::Device;
use tower_glm5::{GlmImage, GlmStages, GlmTower};

/// The implemented runner for a (variants, source, precision) slot of the table, if any.
pub fn runner(
    variants: &'static [&'static str],
    source: &'static str,
    precision: Arith,
) -> Option<Box<dyn Runner>> {
    let glm = !variants.is_empty()
        && variants
            .iter()
            .all(|v| matches!(*v, "glm5_next" | "glm_ocr"));
    match (glm, source, precision) {
        (true, "hf", Arith::HostF32) => Some(Box::new(CaseRunner {
            variants,
            source,
            precision,
            run: glm_case,
        })),
        (true, "hf", Arith::Cuda(_)) => Some(Box::new(GlmCudaRunner {
            variants,
            source,
            precision,
        })),
        _ => None,
    }
}

/// The GLM host reference on the HF mini repository `fixtures/models/<variant>`.
fn glm_case(fixtures: &Path, case: &Case) -> Result<BTreeMap<String, Vec<f64>>> {
    glm_inputs(fixtures, case, |tower, images| {
        let (_, stages) = tower.forward_host(images, true)?;
        Ok(stage_map(stages.context("stages were requested")?))
    })
}

/// Opens the case's mini repository and calls `f` with the tower and the case's images.
fn glm_inputs<T>(
    fixtures: &Path,
    case: &Case,
    f: impl FnOnce(&GlmTower, &[GlmImage<'_>]) -> Result<T>,
) -> Result<T> {
    let path = fixtures.join("models").join(&case.variant);
    let ck = st_reader::Checkpoint::open(&path).with_context(|| path.display().to_string())?;
    let tower = GlmTower::from_checkpoint(&ck)?;
    let inputs = inputs_case(fixtures, case)?;
    let pv = inputs.tensor("pixel_values")?;
    let thw = inputs.tensor("image_grid_thw")?;
    if pv.shape.len() != 2 || pv.shape[1] != tower.config.patch_dim() {
        bail!(
            "pixel_values shape {:?}, expected [N, {}]",
            pv.shape,
            tower.config.patch_dim()
        );
    }
    if thw.shape.len() != 2 || thw.shape[1] != 3 {
        bail!("image_grid_thw shape {:?}, expected [n, 3]", thw.shape);
    }
    let grids: Vec<[usize; 3]> = thw
        .data
        .chunks_exact(3)
        .map(|g| [g[0] as usize, g[1] as usize, g[2] as usize])
        .collect();
    let pv32: Vec<f32> = pv.data.iter().map(|&v| v as f32).collect();
    let images = tower_glm5::split_images(&tower.config, &pv32, &grids)?;
    f(&tower, &images)
}

/// The stage activations by the names the fixtures use, in f64.
fn stage_map(s: GlmStages) -> BTreeMap<String, Vec<f64>> {
    let all = [
        ("patch_embed", s.patch_embed),
        ("block_0", s.block_0),
        ("blocks_out", s.blocks_out),
        ("post_norm", s.post_norm),
        ("downsample", s.downsample),
        ("rows", s.rows),
    ];
    all.into_iter()
        .map(|(k, v)| (k.to_string(), v.into_iter().map(f64::from).collect()))
        .collect()
}

/// The GLM CUDA path (`cuda-f32`, `cuda-bf16`) on the HF mini repositories; "not run" without a
/// device.
struct GlmCudaRunner {
    variants: &'static [&'static str],
    source: &'static str,
    precision: Arith,
}

impl GlmCudaRunner {
    fn run_case(
        &self,
        dev: Arc<Device>,
        fixtures: &Path,
        case: &Case,
    ) -> Result<BTreeMap<String, Vec<f64>>> {
        let p = self.precision.precision();
        glm_inputs(fixtures, case, |tower, images| {
            let mut cuda = tower.to_cuda(dev, p)?;
            let (_, stages) = cuda.encode(images, true)?;
            Ok(stage_map(stages.context("stages were requested")?))
        })
    }
}

impl Runner for GlmCudaRunner {
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
        let dev = match crate::parity_device::shared_device() {
            Ok(d) => d,
            Err(no) => return no.outcome(),
        };
        match self.run_case(dev, fixtures, case) {
            Ok(m) => Outcome::Ran(m),
            Err(e) => Outcome::Error(format!("{e:#}")),
        }
    }
}
