//! The Step-3.7 tower's parity runners: the host reference on each weight source (`vendor`,
//! `sharded`, `hf-layout`).

use crate::parity::{inputs_case, Case, CaseRunner, Precision, Runner, Tensor};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tower_step::{StepProcessorOutput, StepTower};

/// The implemented runner for a (variants, source, precision) slot of the table, if any.
pub fn runner(
    variants: &'static [&'static str],
    source: &'static str,
    precision: Precision,
) -> Option<Box<dyn Runner>> {
    let step = variants.iter().all(|v| *v == "step3p7");
    let known = matches!(source, "vendor" | "sharded" | "hf-layout");
    match (step && known, precision) {
        (true, Precision::HostF32) => Some(Box::new(CaseRunner {
            variants,
            source,
            precision,
            run: move |f: &Path, c: &Case| StepHost { source }.run_case(f, c),
        })),
        _ => None,
    }
}

/// The Step-3.7 host reference on one weight source.
struct StepHost {
    source: &'static str,
}

impl StepHost {
    /// The mini repository of this source.
    fn weights(&self, fixtures: &Path) -> Result<PathBuf> {
        Ok(fixtures.join("models").join(match self.source {
            "vendor" => "step3p7",
            "sharded" => "step3p7_sharded",
            "hf-layout" => "step3p7_hf",
            other => bail!("no {other} weights for step3p7"),
        }))
    }

    fn run_case(&self, fixtures: &Path, case: &Case) -> Result<BTreeMap<String, Vec<f64>>> {
        let path = self.weights(fixtures)?;
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
        let (rows, stages) = tower.forward_host(&images, true)?;
        let s = stages.context("stages were requested")?;
        for (i, (r, img)) in rows.iter().zip(&images).enumerate() {
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
}
