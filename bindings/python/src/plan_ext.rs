//! What the Python plan adds to vision-prep's [`Plan`]: which prompt positions receive rows,
//! and the most rows one image can take under the model's settings.

use vision_towers::vision_prep::law::{step3p7_layout, Step3p7Law};
use vision_towers::vision_prep::{Law, Plan, PromptRun, PromptTokens, Token};
use vision_towers::Model;

/// The placeholder token of a family's prompt: its positions receive the rows; every other
/// token of the plan (gemma4's BOI/EOI, step3p7's patch and image brackets and newlines) stays
/// text (transformers' `get_placeholder_mask`: `input_ids == image_token_id`).
fn placeholder(tokens: &PromptTokens) -> &Token {
    match tokens {
        PromptTokens::Gemma4 { image, .. } | PromptTokens::Glm { image } => image,
        PromptTokens::Step3p7 { im_patch, .. } => im_patch,
    }
}

/// Whether `run`'s positions receive embedding rows.
pub fn run_embeds(run: &PromptRun, tokens: &PromptTokens) -> bool {
    run.token == *placeholder(tokens)
}

/// One flag per prompt token of `plan` (the runs expanded): `true` where the token is an image
/// placeholder that receives a row. Exactly `plan.rows` flags are `true`.
pub fn is_embed(plan: &Plan, tokens: &PromptTokens) -> Vec<bool> {
    let mut mask = Vec::with_capacity(usize::try_from(plan.prompt_len()).unwrap_or(0));
    for run in &plan.prompt_runs {
        let e = run_embeds(run, tokens);
        mask.extend(std::iter::repeat_n(e, run.count as usize));
    }
    mask
}

/// The token table of `tokens`' family with blank texts and no ids (an empty `String` does not
/// allocate): plans of it cost one vector of runs.
fn blank(tokens: &PromptTokens) -> PromptTokens {
    let t = || Token {
        text: String::new(),
        id: None,
    };
    match tokens {
        PromptTokens::Gemma4 { .. } => PromptTokens::Gemma4 {
            boi: t(),
            image: t(),
            eoi: t(),
        },
        PromptTokens::Glm { .. } => PromptTokens::Glm { image: t() },
        PromptTokens::Step3p7 { .. } => PromptTokens::Step3p7 {
            patch_start: t(),
            patch_end: t(),
            patch_newline: t(),
            im_start: t(),
            im_end: t(),
            im_patch: t(),
        },
    }
}

/// The most rows one image admitted under the model's settings gives: the largest plan over a
/// search of image sizes (every side up to 64, then steps of 3 % up to the decode budget, every
/// pair within the budget and each side against the largest other side the budget admits, then
/// ±2 % around the best sizes found), counting only plans the preprocessor would prepare (within
/// the output budget). A lower bound of the true maximum that meets it on the upstream laws'
/// extremes (thin images for glm5_next and step3p7, the soft-token budget for gemma4).
pub fn max_rows_per_image(model: &Model) -> u64 {
    let pre = model.preprocessor();
    let settings = pre.settings();
    let budget = settings.limits.max_pixels;
    let tokens = blank(pre.tokens());
    let rows = |w: u64, h: u64| -> Option<u64> {
        let (w32, h32) = (u32::try_from(w).ok()?, u32::try_from(h).ok()?);
        if w == 0 || h == 0 || w.checked_mul(h)? > budget {
            return None;
        }
        let (rows, bytes) = match pre.law() {
            // Thin step3p7 images have thousands of crops: their plans' runs are not built.
            Law::Step3p7(l) => step3p7_rows(l, w32, h32)?,
            law => {
                let plan = Plan::new(law, &tokens, pre.family(), w32, h32).ok()?;
                (plan.rows, plan.output_bytes())
            }
        };
        (bytes <= settings.max_output_bytes).then_some(rows)
    };
    let top = budget.min(u64::from(u32::MAX));
    let mut sides: Vec<u64> = (1..=64.min(top)).collect();
    let mut s = 64f64;
    loop {
        s *= 1.03;
        let v = s.round() as u64;
        if v > top {
            break;
        }
        if sides.last() != Some(&v) {
            sides.push(v);
        }
    }
    let mut found: Vec<(u64, u64, u64)> = Vec::new();
    let mut consider = |w: u64, h: u64| {
        if let Some(r) = rows(w, h) {
            found.push((r, w, h));
        }
    };
    for &w in &sides {
        for &h in &sides {
            if w.saturating_mul(h) > budget {
                break;
            }
            consider(w, h);
        }
        consider(w, budget / w);
        consider(budget / w, w);
    }
    found.sort_unstable_by(|a, b| b.cmp(a));
    found.dedup();
    let mut best = found.first().map_or(0, |f| f.0);
    for &(_, w, h) in found.iter().take(8) {
        let around = |v: u64| {
            let d = (v / 50).clamp(2, 4096);
            v.saturating_sub(d).max(1)..=v + d
        };
        for w2 in around(w) {
            for h2 in around(h) {
                if let Some(r) = rows(w2, h2) {
                    best = best.max(r);
                }
            }
        }
    }
    best
}

/// A step3p7 image's rows and prepared bytes from its crop layout alone: `Plan::new`'s rows
/// (`crops · (crop side / stride)² + (view side / stride)²`) and `Plan::output_bytes` (f32 views
/// and crops, 16 bytes a row of small tensors), without the plan's runs.
fn step3p7_rows(l: &Step3p7Law, w: u32, h: u32) -> Option<(u64, u64)> {
    let layout = step3p7_layout(l, h, w).ok()?;
    let stride = u64::from(l.vision_patch_size) * u64::from(l.downsampler_stride);
    let (view, crop) = (u64::from(l.image_size), u64::from(l.patch_size));
    let crops = layout.nx * layout.ny;
    let rows = crops * (crop / stride).pow(2) + (view / stride).pow(2);
    let f32s = (3 * view * view).saturating_add(crops.saturating_mul(3 * crop * crop));
    Some((
        rows,
        f32s.saturating_mul(4)
            .saturating_add(rows.saturating_mul(16)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use vision_towers::vision_prep::{ImageSource, PrepSettings};
    use vision_towers::Device;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
    }

    fn open(model: &str) -> Model {
        Model::open(
            &fixtures().join("models").join(model),
            Device::Cpu,
            PrepSettings::default(),
        )
        .unwrap()
    }

    /// The mask marks exactly the placeholder runs: `rows` positions, never BOI/EOI or step3p7's
    /// brackets.
    #[test]
    fn is_embed_marks_the_placeholders_only() {
        let image = std::fs::read(fixtures().join("images/astronaut_336x224.jpg")).unwrap();
        for (model, placeholder) in [
            ("gemma4", 258880),
            ("glm5_next", 154854),
            ("glm_ocr", 59280),
            ("step3p7", 151679),
        ] {
            let m = open(model);
            let plan = m.plan(ImageSource::Bytes(&image)).unwrap();
            let mask = is_embed(&plan, m.preprocessor().tokens());
            assert_eq!(mask.len() as u64, plan.prompt_len(), "{model}");
            assert_eq!(
                mask.iter().filter(|&&e| e).count() as u64,
                plan.rows,
                "{model}"
            );
            let mut at = 0;
            for run in &plan.prompt_runs {
                let want = run.token.id == Some(placeholder);
                assert!(
                    mask[at..at + run.count as usize].iter().all(|&e| e == want),
                    "{model}: {run:?}"
                );
                at += run.count as usize;
            }
        }
    }

    /// The step3p7 shortcut gives the plan's rows and bytes.
    #[test]
    fn step3p7_rows_are_the_plans() {
        let m = open("step3p7");
        let pre = m.preprocessor();
        let Law::Step3p7(l) = pre.law() else {
            panic!("not step3p7")
        };
        for (w, h) in [
            (1, 1),
            (20, 15),
            (3100, 500),
            (5000, 31),
            (48385, 32),
            (700, 2),
            (13, 999),
        ] {
            let plan = pre.plan_size(w, h).unwrap();
            assert_eq!(
                step3p7_rows(l, w, h),
                Some((plan.rows, plan.output_bytes())),
                "{w}x{h}"
            );
        }
    }

    /// The search finds the soft-token budget for gemma4 (70 in the fixture's processor config)
    /// and, for every family, at least the rows of real images.
    #[test]
    fn max_rows_bounds_the_fixture_images() {
        for model in ["gemma4", "glm5_next", "glm_ocr", "step3p7"] {
            let m = open(model);
            let t = std::time::Instant::now();
            let max = max_rows_per_image(&m);
            eprintln!("{model}: max rows {max} ({:?})", t.elapsed());
            if model == "gemma4" {
                assert_eq!(max, 70);
            }
            for e in std::fs::read_dir(fixtures().join("images")).unwrap() {
                let bytes = std::fs::read(e.unwrap().path()).unwrap();
                let plan = m.plan(ImageSource::Bytes(&bytes)).unwrap();
                assert!(plan.rows <= max, "{model}: {} > {max}", plan.rows);
            }
        }
    }
}
