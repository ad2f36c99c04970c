//! vision-prep: image bytes → the tensors and prompt token plan of the vendor image processors
//! (HF transformers 5.23.0) for gemma4, glm5_next, glm_ocr (Glm46VImageProcessor) and step3p7.
//!
//! Pipeline: [`source::admit`] reads only the header (format from the magic bytes, dimensions,
//! decode budget) → [`Plan`] follows from the header alone → [`source::decode`] decodes with the
//! decoder capped to the admitted size → [`resize`] reproduces torchvision's antialiased uint8
//! resize bit for bit → [`prepare`] patchifies into the upstream tensors. An engine preparing many
//! images hands each finished [`Prepared`] back with [`Preprocessor::recycle`], so the next outputs
//! are written into memory already mapped instead of fresh pages.
//!
//! ```no_run
//! use vision_prep::{ImageSource, ModelConfigs, PrepSettings, Preprocessor};
//! # fn main() -> Result<(), vision_prep::PrepError> {
//! let cfg = ModelConfigs { preprocessor_config: Some(serde_json::json!({"image_processor_type": "Gemma4ImageProcessor"})), ..Default::default() };
//! let pre = Preprocessor::from_configs(&cfg, PrepSettings::default())?;
//! let bytes = std::fs::read("cat.png").unwrap_or_default();
//! let plan = pre.plan(ImageSource::Bytes(&bytes))?;          // header only
//! let prepared = pre.prepare(ImageSource::Bytes(&bytes))?;   // decode + resize + patchify
//! assert_eq!(plan, prepared.plan);
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod config;
pub mod error;
mod jpeg;
mod jpeg_entropy;
mod jpeg_frame;
mod jpeg_idct;
pub mod law;
pub mod max_rows;
mod norm;
mod pages;
pub mod plan;
mod pngfast;
pub mod prepare;
pub mod resize;
mod rgb;
pub mod source;
pub mod video;

/// Entry points for the fuzz targets (`fuzz/`), not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    /// Decodes `bytes` (a JPEG of at most `max_pixels`) with our own baseline decode, its entropy
    /// decode split `threads` ways, and with libjpeg: `None` where the header is refused, libjpeg
    /// fails or our decode declines, else whether the two agree byte for byte. A fuzz target
    /// fails on `Some(false)`.
    pub fn own_jpeg_agrees_with_libjpeg(
        bytes: &[u8],
        threads: usize,
        max_pixels: u64,
    ) -> Option<bool> {
        crate::jpeg::own_agrees_with_libjpeg(bytes, threads, max_pixels)
    }
}

#[cfg(test)]
mod parity;

#[cfg(test)]
mod adversarial;

/// Whether the bundled libjpeg-turbo was built with its x86 SIMD code (`nasm` on the build
/// machine's PATH): `Some(false)` decodes JPEG about 2× slower, with the same bytes; `None` where
/// the build could not tell (read by `build.rs` from the `jconfig.h` libjpeg-turbo compiled with).
pub const JPEG_SIMD: Option<bool> = match env!("VT_JPEG_SIMD").as_bytes() {
    b"1" => Some(true),
    b"0" => Some(false),
    _ => None,
};

pub use config::{ModelConfigs, PrepSettings, PromptTokens, Token};
pub use error::{PrepError, Result};
pub use law::Law;
pub use max_rows::MaxRows;
pub use plan::{Family, Geometry, Plan, PromptRun};
pub use prepare::{DType, NamedTensor, Prepared, TensorData};
pub use source::{AdmissionLimits, Header, ImageSource, RgbImage};
pub use video::{
    PreparedVideo, Video, VideoFrames, VideoLimits, VideoMetadata, VideoPiece, VideoPlan,
    VideoPreprocessor, VideoSettings,
};

/// A configured preprocessor for one model.
#[derive(Debug, Clone)]
pub struct Preprocessor {
    law: Law,
    tokens: PromptTokens,
    family: Family,
    settings: PrepSettings,
    /// Intermediate buffers kept between calls (shared by clones).
    scratch: std::sync::Arc<pages::Scratch>,
    /// Output buffers handed back by [`Preprocessor::recycle`] (shared by clones).
    outputs: std::sync::Arc<pages::Scratch<f32>>,
}

fn scratch_for(settings: &PrepSettings) -> std::sync::Arc<pages::Scratch> {
    std::sync::Arc::new(pages::Scratch::new(settings.scratch_bytes))
}

fn outputs_for(settings: &PrepSettings) -> std::sync::Arc<pages::Scratch<f32>> {
    std::sync::Arc::new(pages::Scratch::new(settings.output_pool_bytes))
}

/// Explicit settings for a GGUF mmproj (gemma4), which carries no processor config.
#[derive(Debug, Clone, Default)]
pub struct GgufGemma4Settings {
    /// `clip.vision.patch_size` (default 16).
    pub patch_size: Option<u32>,
    /// Soft token budget (default 280).
    pub max_soft_tokens: Option<u32>,
    /// `boi` token id, if known from the text model's GGUF.
    pub boi_token_id: Option<u32>,
    /// Image soft-token id.
    pub image_token_id: Option<u32>,
    /// `eoi` token id.
    pub eoi_token_id: Option<u32>,
}

impl Preprocessor {
    /// Build from the model directory's JSON configs: the law is the image processor class the
    /// processor config names (as `AutoImageProcessor` resolves it), with that config's sizes and
    /// budgets; `settings` override budgets. Unknown class → [`PrepError::UnknownProcessor`].
    pub fn from_configs(cfg: &ModelConfigs, settings: PrepSettings) -> Result<Preprocessor> {
        let law = config::law_from_configs(cfg, &settings)?;
        let tokens = config::tokens_for(&law, cfg);
        // The family follows the law (what the tower consumes), not the model_type string.
        let family = match &law {
            Law::Gemma4(_) => Family::Gemma4,
            Law::Glm5Next(_) => Family::Glm5Next,
            Law::Glm46V(_) => Family::GlmOcr,
            Law::Step3p7(_) => Family::Step3p7,
        };
        Ok(Preprocessor {
            law,
            tokens,
            family,
            scratch: scratch_for(&settings),
            outputs: outputs_for(&settings),
            settings,
        })
    }

    /// Build from an explicit law and token table (e.g. for tests or non-HF checkpoints).
    pub fn from_law(
        law: Law,
        tokens: PromptTokens,
        family: Family,
        settings: PrepSettings,
    ) -> Preprocessor {
        Preprocessor {
            law,
            tokens,
            family,
            scratch: scratch_for(&settings),
            outputs: outputs_for(&settings),
            settings,
        }
    }

    /// gemma4 for a GGUF mmproj: `Gemma4ImageProcessor` defaults with the GGUF's patch size.
    /// The GGUF's image_mean/std are not used: the HF gemma4 processor does not normalize
    /// (`do_normalize = False`); the tower applies `2·(x − 0.5)` itself.
    pub fn gemma4_gguf(gguf: &GgufGemma4Settings, settings: PrepSettings) -> Result<Preprocessor> {
        let mst = settings
            .max_soft_tokens
            .or(gguf.max_soft_tokens)
            .unwrap_or(280);
        if !law::GEMMA4_SUPPORTED_SOFT_TOKENS.contains(&mst) {
            return Err(PrepError::BadSetting(format!(
                "max_soft_tokens must be one of {:?}, got {mst}",
                law::GEMMA4_SUPPORTED_SOFT_TOKENS
            )));
        }
        // The same bounds `law_from_configs` applies to a processor config's patch size.
        let file = "GGUF clip.vision.patch_size";
        let patch_size = gguf.patch_size.unwrap_or(16);
        if !(1..=config::MAX_CONFIG_SIDE).contains(&patch_size) {
            return Err(PrepError::Config {
                file: file.into(),
                reason: format!(
                    "patch size {patch_size} out of range (1..={})",
                    config::MAX_CONFIG_SIDE
                ),
            });
        }
        let law = Law::Gemma4(law::Gemma4Law {
            patch_size,
            max_soft_tokens: mst,
            ..Default::default()
        });
        config::check_law_bounds(file, &law)?;
        let t = |text: &str, id| Token {
            text: text.into(),
            id,
        };
        let tokens = PromptTokens::Gemma4 {
            boi: t("<|image>", gguf.boi_token_id),
            image: t("<|image|>", gguf.image_token_id),
            eoi: t("<image|>", gguf.eoi_token_id),
        };
        Ok(Preprocessor {
            law,
            tokens,
            family: Family::Gemma4,
            scratch: scratch_for(&settings),
            outputs: outputs_for(&settings),
            settings,
        })
    }

    /// The law in use.
    pub fn law(&self) -> &Law {
        &self.law
    }
    /// The prompt token table in use.
    pub fn tokens(&self) -> &PromptTokens {
        &self.tokens
    }
    /// The family.
    pub fn family(&self) -> Family {
        self.family
    }
    /// The settings.
    pub fn settings(&self) -> &PrepSettings {
        &self.settings
    }

    /// Plan for a `width × height` image (no bytes needed). The admission rules on the size apply
    /// (zero size → `ZeroSized`, over `limits.max_pixels` → `OverBudget`).
    pub fn plan_size(&self, width: u32, height: u32) -> Result<Plan> {
        if width == 0 || height == 0 {
            return Err(PrepError::ZeroSized { width, height });
        }
        let pixels = u64::from(width) * u64::from(height);
        if pixels > self.settings.limits.max_pixels {
            return Err(PrepError::OverBudget {
                width,
                height,
                pixels,
                budget: self.settings.limits.max_pixels,
            });
        }
        Plan::new(&self.law, &self.tokens, self.family, width, height)
    }

    fn check_output(&self, plan: &Plan) -> Result<()> {
        let bytes = plan.output_bytes();
        if bytes > self.settings.max_output_bytes {
            return Err(PrepError::OutputTooLarge {
                bytes,
                budget: self.settings.max_output_bytes,
                rows: plan.rows,
            });
        }
        Ok(())
    }

    /// Plan from the header alone (admission applies; no pixel is decoded).
    pub fn plan(&self, source: ImageSource<'_>) -> Result<Plan> {
        let bytes = source.bytes(&self.settings.limits)?;
        let h = source::admit(&bytes, &self.settings.limits)?;
        self.plan_size(h.width, h.height)
    }

    /// Admit, plan, decode, convert to RGB, resize and patchify.
    pub fn prepare(&self, source: ImageSource<'_>) -> Result<Prepared> {
        let bytes = source.bytes(&self.settings.limits)?;
        let header = source::admit(&bytes, &self.settings.limits)?;
        let plan = self.plan_size(header.width, header.height)?;
        self.check_output(&plan)?;
        if let Some((w, h, filter)) = prepare::whole_resize(&self.law, &plan) {
            // The law needs only the resized image: a large JPEG is resized while it decodes.
            let v = source::decode_resized_in(
                &bytes,
                &header,
                &self.scratch,
                self.bands(),
                (w, h),
                filter,
                self.settings.parallel,
            )?;
            return Ok(prepare::prepare_resized(&self.law, plan, v, self.cx()));
        }
        let rgb = self.decode_admitted(&bytes, &header)?;
        let prepared = prepare::prepare_in(&self.law, plan, &rgb, self.cx());
        self.scratch.give(rgb.data);
        Ok(prepared)
    }

    /// Admit and decode to RGB as [`Preprocessor::prepare`] does (a large baseline JPEG in row
    /// bands on the rayon pool when [`PrepSettings::parallel`] is on), without resizing.
    pub fn decode(&self, source: ImageSource<'_>) -> Result<RgbImage> {
        let bytes = source.bytes(&self.settings.limits)?;
        let header = source::admit(&bytes, &self.settings.limits)?;
        self.decode_admitted(&bytes, &header)
    }

    fn decode_admitted(&self, bytes: &[u8], header: &source::Header) -> Result<RgbImage> {
        source::decode_in(bytes, header, &self.scratch, self.bands())
    }

    /// JPEG decompressors a decode may run at once: the pool's threads when
    /// [`PrepSettings::parallel`] is on, else one.
    fn bands(&self) -> usize {
        if self.settings.parallel {
            rayon::current_num_threads()
        } else {
            1
        }
    }

    fn cx(&self) -> prepare::Cx<'_> {
        prepare::Cx {
            parallel: self.settings.parallel,
            scratch: &self.scratch,
            outputs: &self.outputs,
        }
    }

    /// Hand back a finished [`Prepared`]: its f32 buffers are kept (up to
    /// [`PrepSettings::output_pool_bytes`]) and the next preparations write into them instead of
    /// fresh memory the kernel must zero. The outputs are the same either way.
    pub fn recycle(&self, prepared: Prepared) {
        for t in prepared.tensors {
            if let TensorData::F32(v) = t.data {
                self.outputs.give(v);
            }
        }
    }

    /// The plan of an already decoded RGB image, after checking it as an image: sizes that fit
    /// a header (u32, non-zero), `data` exactly `width·height·3` bytes, within the decode budget.
    fn plan_rgb(&self, rgb: &RgbImage) -> Result<Plan> {
        let (w, h) = (
            u32::try_from(rgb.width)
                .map_err(|_| PrepError::BadSetting("width too large".into()))?,
            u32::try_from(rgb.height)
                .map_err(|_| PrepError::BadSetting("height too large".into()))?,
        );
        if w == 0 || h == 0 {
            return Err(PrepError::ZeroSized {
                width: w,
                height: h,
            });
        }
        let bytes = rgb
            .width
            .checked_mul(rgb.height)
            .and_then(|p| p.checked_mul(3));
        if bytes != Some(rgb.data.len()) {
            return Err(PrepError::BadSetting(format!(
                "RGB buffer of {} bytes for {w}x{h}",
                rgb.data.len()
            )));
        }
        let pixels = u64::from(w) * u64::from(h);
        if pixels > self.settings.limits.max_pixels {
            return Err(PrepError::OverBudget {
                width: w,
                height: h,
                pixels,
                budget: self.settings.limits.max_pixels,
            });
        }
        self.plan_size(w, h)
    }

    /// Prepare an already decoded RGB image (admission limits still apply to its size).
    pub fn prepare_rgb(&self, rgb: &RgbImage) -> Result<Prepared> {
        let plan = self.plan_rgb(rgb)?;
        self.check_output(&plan)?;
        Ok(prepare::prepare_in(&self.law, plan, rgb, self.cx()))
    }

    /// The resized u8 views upstream computes before normalisation (gemma4: the resized image;
    /// glm: the padded canvas; step3p7: the global view, then each crop). The image is checked as
    /// in [`Preprocessor::prepare_rgb`].
    pub fn resized_views(&self, rgb: &RgbImage) -> Result<Vec<RgbImage>> {
        let plan = self.plan_rgb(rgb)?;
        Ok(prepare::resized_views(
            &self.law,
            &plan,
            rgb,
            self.settings.parallel,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic `w × h` RGB image (xorshift pixels).
    fn noise(w: usize, h: usize, seed: u64) -> RgbImage {
        let mut x = seed | 1;
        let data = (0..w * h * 3)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        RgbImage {
            width: w,
            height: h,
            data,
        }
    }

    fn laws() -> [(Law, Family); 4] {
        [
            (Law::Gemma4(law::Gemma4Law::default()), Family::Gemma4),
            (Law::Glm5Next(law::Glm5NextLaw::default()), Family::Glm5Next),
            (Law::Glm46V(law::Glm46VLaw::default()), Family::GlmOcr),
            (Law::Step3p7(law::Step3p7Law::default()), Family::Step3p7),
        ]
    }

    fn preprocessor(law: &Law, family: Family, settings: PrepSettings) -> Preprocessor {
        let tokens = config::tokens_for(law, &ModelConfigs::default());
        Preprocessor::from_law(law.clone(), tokens, family, settings)
    }

    /// A decoded image whose buffer is not `width·height·3` bytes is an error from both public
    /// ways in, for every family, before anything resizes it (`resized_views` once planned from
    /// the sizes alone and handed the short buffer to the resize), and so is a size past u32.
    #[test]
    fn rgb_images_of_the_wrong_length_are_errors() {
        for (law, family) in laws() {
            let pre = preprocessor(&law, family, PrepSettings::default());
            let good = noise(300, 200, 1);
            assert!(pre.prepare_rgb(&good).is_ok());
            assert!(pre.resized_views(&good).is_ok());
            for len in [
                0,
                300 * 3,
                300 * 199 * 3,
                300 * 200 * 3 - 1,
                300 * 200 * 3 + 3,
            ] {
                let img = RgbImage {
                    width: 300,
                    height: 200,
                    data: vec![9; len],
                };
                for r in [
                    pre.prepare_rgb(&img).map(|_| ()),
                    pre.resized_views(&img).map(|_| ()),
                ] {
                    match r {
                        Err(PrepError::BadSetting(m)) => {
                            assert!(m.contains(&format!("{len} bytes for 300x200")), "{m}")
                        }
                        other => panic!("{family:?} {len} bytes: {other:?}"),
                    }
                }
            }
            let huge = RgbImage {
                width: 1 << 33,
                height: 1,
                data: Vec::new(),
            };
            assert!(matches!(
                pre.resized_views(&huge),
                Err(PrepError::BadSetting(_))
            ));
            let zero = RgbImage {
                width: 0,
                height: 5,
                data: Vec::new(),
            };
            assert!(matches!(
                pre.resized_views(&zero),
                Err(PrepError::ZeroSized { .. })
            ));
        }
    }

    /// Recycled outputs are the fresh ones, for every family, on one thread and on the pool, while
    /// the buffers handed back are larger than the next image needs, smaller, or the same.
    #[test]
    fn recycled_outputs_equal_fresh_ones() {
        // Sizes in an order that makes the kept buffers now too large, now too small; 1500×400
        // gives step3p7 local crops, 300×200 none.
        let sizes = [
            (1500, 400),
            (300, 200),
            (641, 479),
            (1500, 400),
            (900, 900),
            (64, 1200),
            (641, 479),
        ];
        for (law, family) in laws() {
            let fresh = preprocessor(
                &law,
                family,
                PrepSettings {
                    parallel: false,
                    scratch_bytes: 0,
                    output_pool_bytes: 0,
                    ..Default::default()
                },
            );
            for parallel in [false, true] {
                let pre = preprocessor(
                    &law,
                    family,
                    PrepSettings {
                        parallel,
                        ..Default::default()
                    },
                );
                for (i, &(w, h)) in sizes.iter().enumerate() {
                    let img = noise(w, h, i as u64 + 1);
                    let want = fresh.prepare_rgb(&img).expect("fresh");
                    let got = pre.prepare_rgb(&img).expect("recycled");
                    assert!(got == want, "{family:?} {w}x{h} parallel={parallel}");
                    pre.recycle(got);
                }
                assert!(pre.outputs.held_bytes() > 0, "{family:?}: nothing was kept");
            }
        }
    }

    /// The output pool never holds more than `output_pool_bytes`, and keeps nothing at 0.
    #[test]
    fn output_pool_stays_within_its_bound() {
        let (law, family) = (Law::Glm46V(law::Glm46VLaw::default()), Family::GlmOcr);
        let one = preprocessor(&law, family, PrepSettings::default())
            .plan_size(900, 900)
            .expect("plan")
            .output_bytes() as usize;
        // Room for two 900×900 tensors, never three.
        for cap in [0, one * 5 / 2] {
            let pre = preprocessor(
                &law,
                family,
                PrepSettings {
                    output_pool_bytes: cap,
                    ..Default::default()
                },
            );
            let kept: Vec<Prepared> = (0..4)
                .map(|i| pre.prepare_rgb(&noise(900, 900, i)).expect("prepare"))
                .collect();
            for p in kept {
                pre.recycle(p);
                assert!(pre.outputs.held_bytes() <= cap, "{:?}", pre.outputs);
            }
            let held = pre.outputs.held_bytes();
            assert_eq!(held > 0, cap > 0, "{:?}", pre.outputs);
        }
    }
}
