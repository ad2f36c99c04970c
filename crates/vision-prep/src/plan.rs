//! The plan: everything about one image that follows from its header alone.

use serde_json::{json, Value};

use crate::config::{PromptTokens, Token};
use crate::error::Result;
use crate::law::{self, Law, Step3p7Layout};

/// Model family, as printed in the plan JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Gemma-4 vision.
    Gemma4,
    /// GLM-5.3-Flash vision.
    Glm5Next,
    /// GLM-OCR (Glm46VImageProcessor).
    GlmOcr,
    /// Step-3.7-Flash.
    Step3p7,
}

impl Family {
    /// `"gemma4" | "glm5_next" | "glm_ocr" | "step3p7"`.
    pub fn name(self) -> &'static str {
        match self {
            Family::Gemma4 => "gemma4",
            Family::Glm5Next => "glm5_next",
            Family::GlmOcr => "glm_ocr",
            Family::Step3p7 => "step3p7",
        }
    }
}

/// Family-specific geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Geometry {
    /// gemma4: resized to `target`, patch grid `gh × gw`, pooled `gh/k × gw/k`.
    Gemma4 {
        /// Patch rows.
        gh: u64,
        /// Patch columns.
        gw: u64,
        /// Pooling kernel `k`.
        pool: u64,
    },
    /// glm5_next / glm46v: canvas `target`, content pasted top-left (glm46v: content = canvas),
    /// `image_grid_thw = [1, gh, gw]`.
    Glm {
        /// Resized content `(width, height)` (≤ canvas; the rest is black padding).
        content: (u64, u64),
        /// Patch rows.
        gh: u64,
        /// Patch columns.
        gw: u64,
        /// Merge size.
        merge: u64,
    },
    /// step3p7: global view + `nx × ny` local crops.
    Step3p7 {
        /// The `_plan_patches` layout.
        layout: Step3p7Layout,
        /// Global view side (728).
        global_side: u64,
        /// Crop side (504).
        crop_side: u64,
        /// Rows per crop (81).
        rows_per_crop: u64,
        /// Rows of the global view (169).
        rows_global: u64,
        /// Newline mask per crop (row-major).
        newline_mask: Vec<bool>,
    },
}

/// A run of one prompt token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptRun {
    /// The token (text + id, `id = None` when unknown).
    pub token: Token,
    /// Repetitions.
    pub count: u64,
    /// Whether these positions receive embedding rows (the image placeholder: gemma4 and glm
    /// `<|image|>`, step3p7 `<im_patch>`) rather than keeping their text embedding (BOI/EOI,
    /// step3p7's patch/image brackets and newlines). Upstream's model takes exactly the positions
    /// where `input_ids == config.image_token_id` (`get_placeholder_mask` in modeling_gemma4.py,
    /// modeling_glm5_next.py, modeling_glm46v.py, modeling_step3p7.py), and the processors write
    /// that id only for the placeholder runs; the rows fill those positions in order.
    pub embeds: bool,
}

/// Bytes of the tensors a plan of `geometry` with `rows` rows prepares: its f32 pixels, plus 16
/// bytes a row for the small integer tensors. [`Plan::output_bytes`] and the output-budget bound
/// of the max-rows search (`max_rows.rs`) are this one function.
pub(crate) fn output_bytes_of(geometry: &Geometry, rows: u64) -> u64 {
    // Saturating: a product past u64 is over any budget, and must not wrap under one.
    let product = |xs: &[u64]| xs.iter().fold(1u64, |a, &x| a.saturating_mul(x));
    let f32s = match geometry {
        Geometry::Gemma4 { gh, gw, .. } => product(&[*gh, *gw, 768]),
        Geometry::Glm { gh, gw, .. } => product(&[*gh, *gw, 1176]),
        Geometry::Step3p7 {
            layout,
            global_side,
            crop_side,
            ..
        } => product(&[3, *global_side, *global_side])
            .saturating_add(product(&[layout.nx, layout.ny, 3, *crop_side, *crop_side])),
    };
    f32s.saturating_mul(4)
        .saturating_add(rows.saturating_mul(16))
}

/// Everything the header determines: target size, grid, embedding rows and prompt token runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Family.
    pub family: Family,
    /// Upstream image processor class whose law was applied.
    pub processor_class: &'static str,
    /// Source width.
    pub width: u32,
    /// Source height.
    pub height: u32,
    /// Target `(width, height)`: gemma4 resized size; glm canvas; step3p7 the capped global size.
    pub target: (u64, u64),
    /// Family geometry.
    pub geometry: Geometry,
    /// Embedding rows the tower emits for this image (= image placeholder tokens in the prompt).
    pub rows: u64,
    /// Token runs the vendor processor writes for this image, in order.
    pub prompt_runs: Vec<PromptRun>,
}

impl Plan {
    /// Compute the plan of a `width × height` image under `law`.
    pub fn new(
        law: &Law,
        tokens: &PromptTokens,
        family: Family,
        width: u32,
        height: u32,
    ) -> Result<Plan> {
        // Text positions (brackets, newlines) and embedding positions (the image placeholder).
        let run = |t: &Token, count: u64| PromptRun {
            token: t.clone(),
            count,
            embeds: false,
        };
        let embed = |t: &Token, count: u64| PromptRun {
            token: t.clone(),
            count,
            embeds: true,
        };
        let (target, geometry, rows, runs) = match (law, tokens) {
            (Law::Gemma4(l), PromptTokens::Gemma4 { boi, image, eoi }) => {
                let (th, tw) = law::gemma4_target(l, height, width)?;
                let p = u64::from(l.patch_size);
                let (gh, gw) = (u64::from(th) / p, u64::from(tw) / p);
                let k = u64::from(l.pooling_kernel_size);
                let n = gh * gw / (k * k);
                (
                    (u64::from(tw), u64::from(th)),
                    Geometry::Gemma4 { gh, gw, pool: k },
                    n,
                    vec![run(boi, 1), embed(image, n), run(eoi, 1)],
                )
            }
            (Law::Glm5Next(l), PromptTokens::Glm { image }) => {
                let (th, tw) = law::glm5_next_canvas(l, height, width)?;
                let (ch, cw) = law::glm5_next_content(l, height, width, (th, tw));
                let p = u64::from(l.patch_size);
                let m = u64::from(l.merge_size);
                let (gh, gw) = (th / p, tw / p);
                let n = gh * gw / (m * m);
                (
                    (tw, th),
                    Geometry::Glm {
                        content: (cw, ch),
                        gh,
                        gw,
                        merge: m,
                    },
                    n,
                    vec![embed(image, n)],
                )
            }
            (Law::Glm46V(l), PromptTokens::Glm { image }) => {
                let (th, tw) = law::glm46v_size(l, height, width)?;
                let p = u64::from(l.patch_size);
                let m = u64::from(l.merge_size);
                let (gh, gw) = (th / p, tw / p);
                let n = gh * gw / (m * m);
                (
                    (tw, th),
                    Geometry::Glm {
                        content: (tw, th),
                        gh,
                        gw,
                        merge: m,
                    },
                    n,
                    vec![embed(image, n)],
                )
            }
            (
                Law::Step3p7(l),
                PromptTokens::Step3p7 {
                    patch_start,
                    patch_end,
                    patch_newline,
                    im_start,
                    im_end,
                    im_patch,
                },
            ) => {
                let layout = law::step3p7_layout(l, height, width)?;
                let (rows_per_crop, rows_global) = law::step3p7_rows(l);
                let k = layout.nx * layout.ny;
                let mut mask = Vec::with_capacity(k as usize);
                for row in 0..layout.ny {
                    for col in 0..layout.nx {
                        mask.push(col == layout.nx - 1 && row < layout.ny - 1);
                    }
                }
                let mut runs = Vec::new();
                for &nl in &mask {
                    runs.push(run(patch_start, 1));
                    runs.push(embed(im_patch, rows_per_crop));
                    runs.push(run(patch_end, 1));
                    if nl {
                        runs.push(run(patch_newline, 1));
                    }
                }
                runs.push(run(im_start, 1));
                runs.push(embed(im_patch, rows_global));
                runs.push(run(im_end, 1));
                (
                    layout.global,
                    Geometry::Step3p7 {
                        layout,
                        global_side: u64::from(l.image_size),
                        crop_side: u64::from(l.patch_size),
                        rows_per_crop,
                        rows_global,
                        newline_mask: mask,
                    },
                    k * rows_per_crop + rows_global,
                    runs,
                )
            }
            _ => {
                return Err(crate::PrepError::BadSetting(
                    "token table does not belong to this law".into(),
                ));
            }
        };
        Ok(Plan {
            family,
            processor_class: law.processor_class(),
            width,
            height,
            target,
            geometry,
            rows,
            prompt_runs: runs,
        })
    }

    /// The grid as printed: gemma4 `[gh, gw]` patches; glm `[1, gh, gw]` (= `image_grid_thw`);
    /// step3p7 `[ny, nx]` local crops.
    pub fn grid(&self) -> Vec<u64> {
        match &self.geometry {
            Geometry::Gemma4 { gh, gw, .. } => vec![*gh, *gw],
            Geometry::Glm { gh, gw, .. } => vec![1, *gh, *gw],
            Geometry::Step3p7 { layout, .. } => vec![layout.ny, layout.nx],
        }
    }

    /// Bytes of the tensors [`crate::Preprocessor::prepare`] would return (all f32 pixels + small integer tensors).
    pub fn output_bytes(&self) -> u64 {
        output_bytes_of(&self.geometry, self.rows)
    }

    /// Total prompt tokens this image occupies.
    pub fn prompt_len(&self) -> u64 {
        self.prompt_runs.iter().map(|r| r.count).sum()
    }

    /// The placeholder mask over this image's prompt tokens, expanded: one entry per token of
    /// [`Plan::prompt_runs`], `true` where the position receives an embedding row (vLLM's
    /// `PromptUpdateDetails.is_embed`). Exactly [`Plan::rows`] entries are `true`.
    pub fn is_embed(&self) -> Vec<bool> {
        self.expand(|r| r.embeds)
    }

    /// The prompt token ids, expanded: one entry per token of [`Plan::prompt_runs`]
    /// (`None` where the token's id is unknown).
    pub fn prompt_ids(&self) -> Vec<Option<u32>> {
        self.expand(|r| r.token.id)
    }

    /// Embedding rows the runs place: the sum of the counts of the runs that embed (= [`Plan::rows`]).
    pub fn embed_positions(&self) -> u64 {
        self.prompt_runs
            .iter()
            .filter(|r| r.embeds)
            .map(|r| r.count)
            .sum()
    }

    fn expand<T: Clone>(&self, f: impl Fn(&PromptRun) -> T) -> Vec<T> {
        // The runs' counts are bounded by the law (rows plus a few brackets per crop).
        let mut out = Vec::with_capacity(usize::try_from(self.prompt_len()).unwrap_or(0));
        for r in &self.prompt_runs {
            out.extend(std::iter::repeat_n(f(r), r.count as usize));
        }
        out
    }

    /// The plan JSON contract:
    /// `{"family","width","height","target":[w,h],"grid","rows","prompt_runs":[[id|null,count],…]}`
    /// plus `"processor"`, `"prompt_tokens"` (the texts, parallel to `prompt_runs`),
    /// `"prompt_embeds"` (per run, parallel to `prompt_runs`: `true` where the run's positions
    /// receive embedding rows, see [`PromptRun::embeds`]) and a family `"detail"`.
    pub fn to_json(&self) -> Value {
        let runs: Vec<Value> = self
            .prompt_runs
            .iter()
            .map(|r| json!([r.token.id, r.count]))
            .collect();
        let embeds: Vec<bool> = self.prompt_runs.iter().map(|r| r.embeds).collect();
        let texts: Vec<Value> = self
            .prompt_runs
            .iter()
            .map(|r| json!(r.token.text))
            .collect();
        let detail = match &self.geometry {
            Geometry::Gemma4 { gh, gw, pool } => {
                json!({"patches": gh * gw, "pooled_grid": [gh / pool, gw / pool]})
            }
            Geometry::Glm {
                content,
                gh,
                gw,
                merge,
            } => {
                json!({"content": [content.0, content.1], "patches": gh * gw, "merge": merge})
            }
            Geometry::Step3p7 {
                layout,
                newline_mask,
                ..
            } => json!({
                "crop": [layout.crop.0, layout.crop.1],
                "window": layout.window,
                "square_pad": layout.square_pad,
                "num_local_patches": layout.nx * layout.ny,
                "newline_mask": newline_mask,
            }),
        };
        json!({
            "family": self.family.name(),
            "processor": self.processor_class,
            "width": self.width,
            "height": self.height,
            "target": [self.target.0, self.target.1],
            "grid": self.grid(),
            "rows": self.rows,
            "prompt_runs": runs,
            "prompt_tokens": texts,
            "prompt_embeds": embeds,
            "detail": detail,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;

    use serde_json::Value;

    use crate::{ModelConfigs, PrepSettings, Preprocessor, RgbImage};

    fn fixture(path: &str) -> Value {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/prep")
            .join(path);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    pub(crate) fn configs_of(v: &Value) -> ModelConfigs {
        ModelConfigs {
            config: v.get("config").cloned(),
            preprocessor_config: v.get("preprocessor_config").cloned(),
            processor_config: v.get("processor_config").cloned(),
            tokenizer_config: v.get("tokenizer_config").cloned(),
            tokenizer_json: v.get("tokenizer_json").cloned(),
        }
    }

    /// Every row of fixtures/prep/plans.json (upstream `_preprocess`/`smart_resize`/`_plan_patches` and the
    /// processors' `replace_image_token`) must equal our header-only plan in full.
    #[test]
    fn plans_match_upstream_table() {
        let table = fixture("plans.json");
        let mut pres: HashMap<String, Preprocessor> = HashMap::new();
        for (name, cfg) in table["configs"].as_object().expect("configs") {
            // The law is under test here, not the decode budget: lift it.
            let mut settings = PrepSettings::default();
            settings.limits.max_pixels = 1 << 40;
            let pre =
                Preprocessor::from_configs(&configs_of(cfg), settings).expect("configs build");
            pres.insert(name.clone(), pre);
        }
        let rows = table["rows"].as_array().expect("rows");
        assert!(rows.len() > 1000, "table too small: {}", rows.len());
        let mut failures = Vec::new();
        for row in rows {
            let variant = row["variant"].as_str().expect("variant");
            let (w, h) = (
                row["width"].as_u64().expect("w") as u32,
                row["height"].as_u64().expect("h") as u32,
            );
            let got = pres[variant].plan_size(w, h);
            let ctx = format!("{variant} {w}x{h}");
            if let Some(e) = row.get("error") {
                if got.is_ok() {
                    failures.push(format!("{ctx}: upstream raised {e}, we planned"));
                }
                continue;
            }
            let plan = match got {
                Ok(p) => p,
                Err(e) => {
                    failures.push(format!("{ctx}: upstream planned, we failed: {e}"));
                    continue;
                }
            };
            let j = plan.to_json();
            let mut check = |what: &str, ours: &Value, theirs: &Value| {
                if ours != theirs {
                    failures.push(format!("{ctx}: {what} ours {ours} upstream {theirs}"));
                }
            };
            check("target", &j["target"], &row["target"]);
            check("grid", &j["grid"], &row["grid"]);
            check("rows", &j["rows"], &row["rows"]);
            check("prompt_runs", &j["prompt_runs"], &row["prompt_runs"]);
            if let Some(c) = row.get("content") {
                check("content", &j["detail"]["content"], c);
            }
            for key in ["crop", "window", "square_pad", "newline_mask"] {
                if let Some(v) = row.get(key) {
                    check(key, &j["detail"][key], v);
                }
            }
            // The placeholder mask: upstream's model embeds exactly the positions where
            // `input_ids == config.image_token_id` (`get_placeholder_mask`); upstream's expansion
            // is the table's runs, the id is the variant's config value.
            let image_id = table["configs"][variant]["config"]["image_token_id"]
                .as_u64()
                .expect("image_token_id");
            let mut theirs = Vec::new();
            for r in row["prompt_runs"].as_array().expect("runs") {
                let (id, n) = (r[0].as_u64(), r[1].as_u64().expect("count"));
                theirs.extend(std::iter::repeat_n(id == Some(image_id), n as usize));
            }
            if plan.is_embed() != theirs {
                failures.push(format!(
                    "{ctx}: is_embed differs from upstream's placeholder mask"
                ));
            }
            if plan.embed_positions() != plan.rows {
                failures.push(format!(
                    "{ctx}: {} embedding positions vs {} rows",
                    plan.embed_positions(),
                    plan.rows
                ));
            }
        }
        assert!(
            failures.is_empty(),
            "{} mismatches, first: {:#?}",
            failures.len(),
            &failures[..failures.len().min(20)]
        );
    }

    /// Every fixture model's preprocessor and every configuration of the plan table.
    pub(crate) fn fixture_preprocessors(settings: PrepSettings) -> Vec<(String, Preprocessor)> {
        let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models");
        let mut out = Vec::new();
        for m in [
            "gemma4",
            "gemma4_clipped",
            "glm5_next",
            "glm_ocr",
            "step3p7",
            "step3p7_hf",
        ] {
            let cfg = ModelConfigs::from_dir(&models.join(m)).expect("model configs");
            let pre = Preprocessor::from_configs(&cfg, settings).expect("model preprocessor");
            out.push((format!("models/{m}"), pre));
        }
        let table = fixture("plans.json");
        for (name, cfg) in table["configs"].as_object().expect("configs") {
            let pre = Preprocessor::from_configs(&configs_of(cfg), settings).expect("configs");
            out.push((format!("plans.json {name}"), pre));
        }
        out
    }

    /// The embedding runs place exactly the plan's rows, and the expanded mask and ids are one
    /// entry per prompt token, on every fixture configuration and many sizes (thin, huge, capped,
    /// up to thousands of step3p7 crops).
    #[test]
    fn embed_runs_place_every_row() {
        let mut sizes: Vec<(u32, u32)> = vec![
            (1, 1),
            (5, 300),
            (300, 5),
            (20, 15),
            (660, 300),
            (1920, 1080),
            (3024, 3024),
            (4000, 3000),
            (16129, 32),
            (48385, 32),
            (60000, 32),
            (1, 223_973),
            (21000, 280),
        ];
        for i in 0..200u32 {
            sizes.push((1 + (i * 7919) % 6000, 1 + (i * 104_729 + 17) % 4000));
        }
        let mut settings = PrepSettings::default();
        settings.limits.max_pixels = 1 << 40;
        let mut checked = 0;
        for (name, pre) in fixture_preprocessors(settings) {
            for &(w, h) in &sizes {
                let Ok(plan) = pre.plan_size(w, h) else {
                    continue;
                };
                let ctx = format!("{name} {w}x{h}");
                assert_eq!(plan.embed_positions(), plan.rows, "{ctx}");
                let mask = plan.is_embed();
                assert_eq!(mask.len() as u64, plan.prompt_len(), "{ctx}");
                assert_eq!(
                    mask.iter().filter(|&&b| b).count() as u64,
                    plan.rows,
                    "{ctx}"
                );
                let ids = plan.prompt_ids();
                assert_eq!(ids.len(), mask.len(), "{ctx}");
                // The embedding positions hold the one placeholder token, no other position does.
                let image = plan.prompt_runs.iter().find(|r| r.embeds).map(|r| &r.token);
                for r in &plan.prompt_runs {
                    assert_eq!(Some(&r.token) == image, r.embeds, "{ctx}: {r:?}");
                }
                checked += 1;
            }
        }
        assert!(checked > 2000, "only {checked} plans");
    }

    /// The decoded preparation lands exactly on the header-only plan, for many sizes and every law.
    #[test]
    fn prepared_tensors_land_on_plan() {
        let table = fixture("plans.json");
        let mut sizes: Vec<(u32, u32)> = vec![
            (1, 1),
            (2, 3),
            (5, 300),
            (300, 5),
            (31, 200),
            (660, 300),
            (640, 480),
            (97, 1201),
        ];
        for i in 0..24u32 {
            sizes.push((1 + (i * 97) % 900, 1 + (i * 61 + 13) % 700));
        }
        for (name, cfg) in table["configs"].as_object().expect("configs") {
            let pre = Preprocessor::from_configs(&configs_of(cfg), PrepSettings::default())
                .expect("configs");
            for &(w, h) in &sizes {
                let plan = match pre.plan_size(w, h) {
                    Ok(p) => p,
                    Err(_) => continue,
                };
                let img = RgbImage {
                    width: w as usize,
                    height: h as usize,
                    data: (0..w as usize * h as usize * 3)
                        .map(|i| (i * 31 % 251) as u8)
                        .collect(),
                };
                let prep = pre.prepare_rgb(&img).expect("prepare");
                assert_eq!(prep.plan, plan);
                let ctx = format!("{name} {w}x{h}");
                if let Some(g) = prep.gemma4() {
                    let grid = plan.grid();
                    assert_eq!(g.num_patches() as u64, grid[0] * grid[1], "{ctx}");
                    assert_eq!(g.num_patches() as u64, plan.rows * 9, "{ctx}");
                    assert_eq!(g.patches.len(), g.num_patches() * 768, "{ctx}");
                } else if let Some(g) = prep.glm() {
                    assert_eq!(
                        g.grid_thw.iter().map(|&x| x as u64).collect::<Vec<_>>(),
                        plan.grid(),
                        "{ctx}"
                    );
                    assert_eq!(g.patches.len() as u64, plan.rows * 4 * 1176, "{ctx}");
                } else if let Some(s) = prep.step3p7() {
                    let k = s.crops.len();
                    assert_eq!(s.global.pixels.len(), 3 * 728 * 728, "{ctx}");
                    assert_eq!((s.global.height, s.global.width), (728, 728), "{ctx}");
                    assert_eq!((k * 81 + 169) as u64, plan.rows, "{ctx}");
                    assert_eq!(s.newline_mask.len(), k, "{ctx}");
                    for c in &s.crops {
                        assert_eq!((c.height, c.width), (504, 504), "{ctx}");
                        assert_eq!(c.pixels.len(), 3 * 504 * 504, "{ctx}");
                    }
                } else {
                    panic!("{ctx}: no family view");
                }
            }
        }
    }
}
