//! The Step-3.7 tower's parity runners: the host reference and (on a CUDA machine) the
//! `StepCuda` path in both precisions, on each weight source (`vendor`, `sharded`, `hf-layout`).

use crate::parity_case::{inputs_case, Arith, Case, CaseRunner, Outcome, Runner, Tensor};
use anyhow::{bail, Context, Result};
use gpu_core::DeviceTower;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tower_step::cuda::Device;
use tower_step::{StepImage, StepProcessorOutput, StepRows, StepStages, StepTower};

/// The implemented runner for a (variants, source, precision) slot of the table, if any.
pub fn runner(
    variants: &'static [&'static str],
    source: &'static str,
    precision: Arith,
) -> Option<Box<dyn Runner>> {
    let step = !variants.is_empty() && variants.iter().all(|v| *v == "step3p7");
    let known = matches!(source, "vendor" | "sharded" | "hf-layout");
    match (step && known, precision) {
        (true, Arith::HostF32) => Some(Box::new(CaseRunner {
            variants,
            source,
            precision,
            run: move |f: &Path, c: &Case| {
                step_inputs(f, c, source, |tower, images| {
                    let (rows, stages) = tower.forward_host(images, true)?;
                    stage_map(&rows, images, stages)
                })
            },
        })),
        (true, Arith::Cuda(_)) => Some(Box::new(StepCudaRunner {
            variants,
            source,
            precision,
        })),
        _ => None,
    }
}

/// The mini repository of a weight source.
fn weights(fixtures: &Path, source: &str) -> Result<PathBuf> {
    Ok(fixtures.join("models").join(match source {
        "vendor" => "step3p7",
        "sharded" => "step3p7_sharded",
        "hf-layout" => "step3p7_hf",
        other => bail!("no {other} weights for step3p7"),
    }))
}

/// Opens the source's mini repository and calls `f` with the tower and the case's images.
fn step_inputs<T>(
    fixtures: &Path,
    case: &Case,
    source: &str,
    f: impl FnOnce(&StepTower, &[StepImage<'_>]) -> Result<T>,
) -> Result<T> {
    let path = weights(fixtures, source)?;
    let ck = st_reader::Checkpoint::open(&path).with_context(|| path.display().to_string())?;
    let tower = StepTower::from_checkpoint(&ck)?;
    let inputs = inputs_case(fixtures, case)?;
    let f32s = |t: &Tensor| t.data.iter().map(|&v| v as f32).collect::<Vec<f32>>();
    let square = |t: &Tensor, name: &str| -> Result<usize> {
        match t.shape[..] {
            [_, 3, s, s2] if s == s2 => Ok(s),
            _ => bail!("{name} shape {:?} is not [B, 3, S, S]", t.shape),
        }
    };
    let pv = inputs.tensor("pixel_values")?;
    let side = square(&pv, "pixel_values")?;
    let nlp: Vec<usize> = inputs
        .tensor("num_local_patches")?
        .data
        .iter()
        .map(|&v| v as usize)
        .collect();
    let (local, local_side) = if nlp.iter().any(|&n| n > 0) {
        let t = inputs.tensor("pixel_values_local")?;
        let s = square(&t, "pixel_values_local")?;
        (f32s(&t), s)
    } else {
        (Vec::new(), 0)
    };
    let masks: Option<Vec<bool>> = inputs
        .tensor("patch_newline_masks")
        .ok()
        .map(|t| t.data.iter().map(|&v| v != 0.0).collect());
    let global = f32s(&pv);
    let batch = StepProcessorOutput {
        pixel_values: &global,
        side,
        pixel_values_local: &local,
        local_side,
        num_local_patches: &nlp,
        patch_newline_masks: masks.as_deref(),
    };
    let images = batch.images()?;
    f(&tower, &images)
}

/// The stage activations by the names the fixtures use (`global/…`, `local/…`, `rows`), in
/// f64, after checking that every image's newline mask came back unchanged.
fn stage_map(
    rows: &[StepRows],
    images: &[StepImage<'_>],
    stages: Option<StepStages>,
) -> Result<BTreeMap<String, Vec<f64>>> {
    let s = stages.context("stages were requested")?;
    for (i, (r, img)) in rows.iter().zip(images).enumerate() {
        if r.newline_mask != img.newline_mask {
            bail!("image {i}: the newline mask did not come back unchanged");
        }
    }
    let mut out = BTreeMap::new();
    for (kind, v) in [("global", &s.global), ("local", &s.local)] {
        for (name, values) in v.named() {
            out.insert(
                format!("{kind}/{name}"),
                values.iter().map(|&x| f64::from(x)).collect(),
            );
        }
    }
    out.insert(
        "rows".to_string(),
        s.rows.iter().map(|&x| f64::from(x)).collect(),
    );
    Ok(out)
}

/// The Step-3.7 CUDA path (`cuda-f32`, `cuda-bf16`) on one weight source; "not run" without a
/// device.
struct StepCudaRunner {
    variants: &'static [&'static str],
    source: &'static str,
    precision: Arith,
}

impl StepCudaRunner {
    fn run_case(
        &self,
        dev: Arc<Device>,
        fixtures: &Path,
        case: &Case,
    ) -> Result<BTreeMap<String, Vec<f64>>> {
        let p = self.precision.precision();
        step_inputs(fixtures, case, self.source, |tower, images| {
            let mut cuda = tower.to_cuda(dev, p)?;
            let (rows, stages) = cuda.encode(images, true)?;
            stage_map(&rows, images, stages)
        })
    }
}

impl Runner for StepCudaRunner {
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
