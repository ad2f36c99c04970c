//! The glm towers' parity runners: the `tower-glm5` host reference for `glm5_next` and
//! `glm_ocr` from their HF mini repositories.

use crate::parity::{inputs_case, Case, CaseRunner, Precision, Runner};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;
use tower_glm5::{Glm5Tower, GlmImage};

/// The implemented runner for a (variants, source, precision) slot of the table, if any.
pub fn runner(
    variants: &'static [&'static str],
    source: &'static str,
    precision: Precision,
) -> Option<Box<dyn Runner>> {
    let glm = !variants.is_empty()
        && variants
            .iter()
            .all(|v| matches!(*v, "glm5_next" | "glm_ocr"));
    match (glm, source, precision) {
        (true, "hf", Precision::HostF32) => Some(Box::new(CaseRunner {
            variants,
            source,
            precision,
            run: glm_case,
        })),
        _ => None,
    }
}

/// The GLM host reference on the HF mini repository `fixtures/models/<variant>`.
fn glm_case(fixtures: &Path, case: &Case) -> Result<BTreeMap<String, Vec<f64>>> {
    let path = fixtures.join("models").join(&case.variant);
    let ck = st_reader::Checkpoint::open(&path).with_context(|| path.display().to_string())?;
    let tower = Glm5Tower::from_checkpoint(&ck)?;
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
    let images = GlmImage::split(&tower.config, &pv32, &grids)?;
    let (_, stages) = tower.forward_host(&images, true)?;
    let s = stages.context("stages were requested")?;
    let all = [
        ("patch_embed", s.patch_embed),
        ("block_0", s.block_0),
        ("blocks_out", s.blocks_out),
        ("post_norm", s.post_norm),
        ("downsample", s.downsample),
        ("rows", s.rows),
    ];
    Ok(all
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into_iter().map(f64::from).collect()))
        .collect())
}
