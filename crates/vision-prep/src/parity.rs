//! Parity against the upstream processor fixtures in `fixtures/outputs/` (written by the oracle
//! generator from transformers 5.23.0; see fixtures/README.md).
//!
//! Bounds (measured, then asserted):
//! - plans, grids, position ids, crop counts, newline masks and prompt token ids/counts: exactly equal;
//! - every source, lossless (PNG, lossless WebP) and JPEG (decoded by libjpeg-turbo as Pillow does):
//!   resized u8 views and the f32 tensors bit-exact; the exact share is reported per family and kind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use serde_json::Value;

use crate::law::{Law, Step3p7Law};
use crate::{config, ImageSource, ModelConfigs, PrepSettings, Preprocessor, RgbImage, TensorData};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn model_configs(dir: &Path) -> ModelConfigs {
    ModelConfigs::from_dir(dir).expect("model configs")
}

fn preprocessor_for(meta: &Value) -> Preprocessor {
    let model = meta["model"].as_str().unwrap_or("");
    let variant = meta["variant"].as_str().unwrap_or("");
    if let Some(p) = meta.get("processor").filter(|_| model.is_empty()) {
        // step3p7 with an explicit (real) processor config: tokens from the step3p7 mini repo.
        let cfg = model_configs(&fixtures().join("models").join(variant));
        let law = Law::Step3p7(Step3p7Law {
            image_size: p["size"].as_u64().expect("size") as u32,
            patch_size: p["patch_size"].as_u64().expect("patch") as u32,
            max_image_size: p["max_image_size"].as_u64().expect("max") as u32,
            ..Default::default()
        });
        let tokens = config::tokens_for(&law, &cfg);
        return Preprocessor::from_law(
            law,
            tokens,
            crate::Family::Step3p7,
            PrepSettings::default(),
        );
    }
    Preprocessor::from_configs(
        &model_configs(&fixtures().join(model)),
        PrepSettings::default(),
    )
    .expect("configs")
}

fn u8_chw_to_hwc(st: &SafeTensors<'_>, name: &str, index: usize) -> Option<RgbImage> {
    let t = st.tensor(name).ok()?;
    let shape = t.shape();
    let (h, w) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let plane = h * w;
    let data = &t.data()[index * 3 * plane..(index + 1) * 3 * plane];
    let mut out = vec![0u8; 3 * plane];
    for c in 0..3 {
        for i in 0..plane {
            out[i * 3 + c] = data[c * plane + i];
        }
    }
    Some(RgbImage {
        width: w,
        height: h,
        data: out,
    })
}

fn i64s(st: &SafeTensors<'_>, name: &str) -> Option<Vec<i64>> {
    let t = st.tensor(name).ok()?;
    Some(
        t.data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .collect(),
    )
}

fn f32s(st: &SafeTensors<'_>, name: &str) -> Option<Vec<f32>> {
    let t = st.tensor(name).ok()?;
    Some(
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap_or([0; 4])))
            .collect(),
    )
}

#[derive(Default, Debug)]
struct Stat {
    bytes: usize,
    exact: usize,
    max_diff: u8,
}

impl Stat {
    fn add(&mut self, a: &[u8], b: &[u8]) {
        self.bytes += a.len();
        self.exact += a.iter().zip(b).filter(|(x, y)| x == y).count();
        self.max_diff = self.max_diff.max(
            a.iter()
                .zip(b)
                .map(|(x, y)| x.abs_diff(*y))
                .max()
                .unwrap_or(0),
        );
    }
}

/// Every `<variant>/<case>.safetensors` under `out_dir`, sorted; an error saying so when the
/// directory is missing or holds none (a parity test must fail then, not pass having compared
/// nothing).
fn fixture_files(out_dir: &Path) -> Result<Vec<PathBuf>, String> {
    let missing = |why: String| {
        format!(
            "{}: {why}: the oracle fixtures are missing (fixtures/README.md; \
             `cargo xtask fixtures` regenerates them)",
            out_dir.display()
        )
    };
    let variants = std::fs::read_dir(out_dir).map_err(|e| missing(e.to_string()))?;
    let mut files = Vec::new();
    for v in variants {
        let v = v.map_err(|e| missing(e.to_string()))?.path();
        if !v.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&v).map_err(|e| missing(e.to_string()))? {
            let f = f.map_err(|e| missing(e.to_string()))?.path();
            if f.extension().is_some_and(|e| e == "safetensors") {
                files.push(f);
            }
        }
    }
    if files.is_empty() {
        return Err(missing("no fixture files".into()));
    }
    files.sort();
    Ok(files)
}

/// A missing or empty fixture directory is an error that names it, never zero cases that pass.
#[test]
fn missing_fixture_outputs_are_an_error_not_a_pass() {
    let e = fixture_files(Path::new("/nonexistent/fixtures/outputs")).expect_err("missing");
    assert!(e.contains("/nonexistent/fixtures/outputs") && e.contains("fixtures are missing"));
    let empty = std::env::temp_dir().join(format!("vp-parity-empty-{}", std::process::id()));
    std::fs::create_dir_all(empty.join("gemma4")).expect("scratch dir");
    let e = fixture_files(&empty).expect_err("empty");
    std::fs::remove_dir_all(&empty).ok();
    assert!(e.contains("no fixture files"), "{e}");
    assert!(fixture_files(&fixtures().join("outputs")).is_ok_and(|f| f.len() >= 30));
}

fn is_lossless(image: &str) -> bool {
    image.ends_with(".png") || image.ends_with(".webp")
}

/// Processor fixtures (`proc_*`): plan, grid, ids, masks exact; resized u8 views and f32 tensors
/// bit-exact for every source. (JPEG sources had a bound of 12 (`JPEG_MAX_ABS_DIFF`) while the
/// decoder was zune-jpeg; it is 0 since JPEG is decoded by libjpeg-turbo, as Pillow does.)
#[test]
fn processor_fixtures() {
    let out_dir = fixtures().join("outputs");
    let files = fixture_files(&out_dir).unwrap_or_else(|e| panic!("{e}"));
    let mut stats: BTreeMap<String, Stat> = BTreeMap::new();
    let mut checked = 0;
    let mut failures = Vec::new();
    for path in files {
        let bytes = std::fs::read(&path).expect("read");
        let (_, header) = SafeTensors::read_metadata(&bytes).expect("header");
        let st = SafeTensors::deserialize(&bytes).expect("safetensors");
        let meta: Value = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get("fixture"))
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or(Value::Null);
        let has_inputs = st.tensor("pixel_values").is_ok() || st.tensor("resized_u8").is_ok();
        let crafted = path
            .file_stem()
            .is_some_and(|s| s.to_string_lossy().starts_with("video"));
        if !has_inputs || crafted || meta["images"].as_array().is_none() {
            continue;
        }
        let pre = preprocessor_for(&meta);
        let images: Vec<String> = meta["images"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(String::from))
            .collect();
        let ctx = path
            .strip_prefix(&out_dir)
            .unwrap_or(&path)
            .display()
            .to_string();
        let mut glm_row = 0usize;
        let mut local_row = 0usize;
        for (b, image) in images.iter().enumerate() {
            let data = std::fs::read(fixtures().join("images").join(image)).expect("image");
            let prep = pre.prepare(ImageSource::Bytes(&data)).expect("prepare");
            let plan_only = pre.plan(ImageSource::Bytes(&data)).expect("plan");
            assert_eq!(plan_only, prep.plan, "{ctx}");
            let fam = pre.family().name().to_string();
            let key = format!(
                "{fam} {}",
                if is_lossless(image) {
                    "lossless"
                } else {
                    "jpeg"
                }
            );
            checked += 1;
            // prompt plan: ids and counts (glm: the chat-template wrappers are not the processor's).
            if let Some(pp) = meta["prompt_plan"].get(b).and_then(Value::as_array) {
                let theirs: Vec<(Option<u64>, u64)> = pp
                    .iter()
                    .filter(|r| {
                        !matches!(
                            r["token"].as_str(),
                            Some("<|begin_of_image|>" | "<|end_of_image|>")
                        )
                    })
                    .map(|r| (r["id"].as_u64(), r["count"].as_u64().unwrap_or(0)))
                    .collect();
                let ours: Vec<(Option<u64>, u64)> = prep
                    .plan
                    .prompt_runs
                    .iter()
                    .map(|r| (r.token.id.map(u64::from), r.count))
                    .collect();
                if ours != theirs {
                    failures.push(format!(
                        "{ctx} {image}: prompt runs ours {ours:?} upstream {theirs:?}"
                    ));
                }
            }
            let views = pre
                .resized_views(
                    &crate::source::load(ImageSource::Bytes(&data), &Default::default())
                        .expect("load")
                        .1,
                )
                .expect("views");
            let stat = stats.entry(key).or_default();
            if let Some(r) = u8_chw_to_hwc(&st, "resized_u8", b) {
                if (r.width, r.height) != (views[0].width, views[0].height) {
                    failures.push(format!(
                        "{ctx}: resized {}x{} vs ours {}x{}",
                        r.width, r.height, views[0].width, views[0].height
                    ));
                } else {
                    stat.add(&views[0].data, &r.data);
                    if views[0].data != r.data {
                        failures.push(format!("{ctx} {image}: resized_u8 not bit-exact"));
                    }
                }
            }
            if let Some(idx) = i64s(&st, "resized_local_index") {
                for (k, &tile) in idx.iter().enumerate() {
                    let Some(r) = u8_chw_to_hwc(&st, "resized_local_u8", k) else {
                        continue;
                    };
                    let ours = &views[1 + tile as usize];
                    stat.add(&ours.data, &r.data);
                    if ours.data != r.data {
                        failures.push(format!("{ctx} {image}: local tile {tile} not bit-exact"));
                    }
                }
            }
            // Integer tensors exact.
            if let (Some(g), Some(ours)) = (i64s(&st, "image_grid_thw"), prep.glm()) {
                if g[b * 3..b * 3 + 3]
                    .iter()
                    .map(|&v| usize::try_from(v).ok())
                    .ne(ours.grid_thw.map(Some))
                {
                    failures.push(format!(
                        "{ctx}: grid {:?} vs {:?}",
                        &g[b * 3..b * 3 + 3],
                        ours.grid_thw
                    ));
                }
            }
            if let (Some(n), Some(ours)) = (i64s(&st, "num_local_patches"), prep.step3p7()) {
                if n[b] as usize != ours.crops.len() {
                    failures.push(format!("{ctx}: num_local {} vs {}", n[b], ours.crops.len()));
                }
                if let Some(m) = meta["patch_newline_masks"].get(b).and_then(Value::as_array) {
                    let theirs: Vec<bool> = m
                        .iter()
                        .take(ours.crops.len())
                        .map(|v| v.as_bool() == Some(true))
                        .collect();
                    if theirs != ours.newline_mask {
                        failures.push(format!(
                            "{ctx}: newline mask {theirs:?} vs {:?}",
                            ours.newline_mask
                        ));
                    }
                }
            }
            if let (Some(pos), Some(ours)) = (i64s(&st, "image_position_ids"), prep.gemma4()) {
                let per = pos.len() / images.len();
                if pos[b * per..b * per + ours.positions.len()] != *ours.positions
                    || pos[b * per + ours.positions.len()..(b + 1) * per]
                        .iter()
                        .any(|&v| v != -1)
                {
                    failures.push(format!("{ctx}: position ids differ"));
                }
            }
            // Float tensors (tower cases store the processor's own pixel_values): bit-exact for lossless.
            if let Some(pv) = f32s(&st, "pixel_values") {
                let (ours, theirs): (Vec<f32>, Vec<f32>) =
                    match (&prep.gemma4(), &prep.glm(), &prep.step3p7()) {
                        (Some(g), _, _) => {
                            let per = pv.len() / images.len();
                            let s = &pv[b * per..b * per + g.patches.len()];
                            (g.patches.to_vec(), s.to_vec())
                        }
                        (_, Some(g), _) => {
                            let s = pv[glm_row..glm_row + g.patches.len()].to_vec();
                            glm_row += g.patches.len();
                            (g.patches.to_vec(), s)
                        }
                        (_, _, Some(s)) => {
                            let per = pv.len() / images.len();
                            (
                                s.global.pixels.to_vec(),
                                pv[b * per..(b + 1) * per].to_vec(),
                            )
                        }
                        _ => (Vec::new(), Vec::new()),
                    };
                if ours
                    .iter()
                    .map(|x| x.to_bits())
                    .ne(theirs.iter().map(|x| x.to_bits()))
                {
                    failures.push(format!("{ctx} {image}: pixel_values not bit-exact"));
                }
            }
            if let (Some(pl), Some(s)) = (f32s(&st, "pixel_values_local"), prep.step3p7()) {
                let local: Vec<f32> = s
                    .crops
                    .iter()
                    .flat_map(|c| c.pixels.iter().copied())
                    .collect();
                let n = local.len();
                if n > 0
                    && local
                        .iter()
                        .map(|x| x.to_bits())
                        .ne(pl[local_row..local_row + n].iter().map(|x| x.to_bits()))
                {
                    failures.push(format!("{ctx} {image}: pixel_values_local not bit-exact"));
                }
                local_row += n;
            }
            if let Some(TensorData::F32(_)) = prep.tensor("pixel_values").map(|t| &t.data) {
            } else {
                failures.push(format!("{ctx}: no pixel_values"));
            }
        }
    }
    for (k, s) in &stats {
        eprintln!(
            "parity {k}: {}/{} resized bytes exact ({:.4}%), max diff {}",
            s.exact,
            s.bytes,
            100.0 * s.exact as f64 / s.bytes.max(1) as f64,
            s.max_diff
        );
        assert_eq!(s.max_diff, 0, "{k}: resized bytes differ from upstream");
    }
    assert!(checked >= 30, "only {checked} fixture images checked");
    assert!(
        failures.is_empty(),
        "{} failures: {:#?}",
        failures.len(),
        failures
    );
}

/// Kept buffers and threads change nothing: every fixture image in turn through one preprocessor
/// per model (so each reuses buffers holding the previous images' pixels, on the rayon pool, and
/// writes into the outputs of the previous images, handed back with `recycle`) gives the tensors
/// of a one-thread preprocessor that keeps nothing, for all four laws and the real-size step3p7
/// law.
#[test]
fn scratch_and_threads_change_nothing() {
    let mut images: Vec<PathBuf> = std::fs::read_dir(fixtures().join("images"))
        .expect("fixtures/images")
        .flatten()
        .map(|e| e.path())
        .collect();
    images.sort();
    // Zero images would compare nothing and pass.
    assert!(
        images.len() >= 10,
        "only {} images under fixtures/images",
        images.len()
    );
    let fresh = PrepSettings {
        scratch_bytes: 0,
        output_pool_bytes: 0,
        parallel: false,
        ..Default::default()
    };
    let mut pairs: Vec<(Preprocessor, Preprocessor)> =
        ["gemma4", "glm5_next", "glm_ocr", "step3p7"]
            .iter()
            .map(|m| {
                let cfg = model_configs(&fixtures().join("models").join(m));
                (
                    Preprocessor::from_configs(&cfg, PrepSettings::default()).expect("cfg"),
                    Preprocessor::from_configs(&cfg, fresh).expect("cfg"),
                )
            })
            .collect();
    let real = |s: PrepSettings| {
        let law = Law::Step3p7(Step3p7Law::default());
        let cfg = model_configs(&fixtures().join("models").join("step3p7"));
        let tokens = config::tokens_for(&law, &cfg);
        Preprocessor::from_law(law, tokens, crate::Family::Step3p7, s)
    };
    pairs.push((real(PrepSettings::default()), real(fresh)));
    for (kept, none) in &pairs {
        for _round in 0..2 {
            for path in &images {
                let bytes = std::fs::read(path).expect("image");
                let a = kept.prepare(ImageSource::Bytes(&bytes)).expect("prepare");
                let b = none.prepare(ImageSource::Bytes(&bytes)).expect("prepare");
                assert!(a == b, "{:?} {}", kept.family(), path.display());
                kept.recycle(a);
            }
        }
    }
}
