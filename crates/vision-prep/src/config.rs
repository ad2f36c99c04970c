//! Choosing the law from the model's JSON configs, and finding prompt token ids.

use serde_json::Value;

use crate::error::{PrepError, Result};
use crate::law::{
    Gemma4Law, Glm46VLaw, Glm5NextLaw, Law, Step3p7Law, GEMMA4_SUPPORTED_SOFT_TOKENS,
};
use crate::resize::Filter;

/// The JSON files of a model directory, parsed by the caller (any may be absent).
#[derive(Debug, Clone, Default)]
pub struct ModelConfigs {
    /// `config.json`.
    pub config: Option<Value>,
    /// `preprocessor_config.json`.
    pub preprocessor_config: Option<Value>,
    /// `processor_config.json` (may nest the image processor under `image_processor`).
    pub processor_config: Option<Value>,
    /// `tokenizer_config.json` (`added_tokens_decoder`, special token names).
    pub tokenizer_config: Option<Value>,
    /// `tokenizer.json` (`added_tokens`).
    pub tokenizer_json: Option<Value>,
}

impl ModelConfigs {
    /// Read `config.json`, `preprocessor_config.json`, `processor_config.json`,
    /// `tokenizer_config.json` and `tokenizer.json` from a model directory; absent files are `None`,
    /// unreadable or malformed ones are a [`PrepError::Config`].
    pub fn from_dir(dir: &std::path::Path) -> Result<ModelConfigs> {
        let read = |name: &str| -> Result<Option<Value>> {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Ok(text) => serde_json::from_str(&text)
                    .map(Some)
                    .map_err(|e| cfg_err(&path.display().to_string(), format!("not JSON: {e}"))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(cfg_err(&path.display().to_string(), e.to_string())),
            }
        };
        Ok(ModelConfigs {
            config: read("config.json")?,
            preprocessor_config: read("preprocessor_config.json")?,
            processor_config: read("processor_config.json")?,
            tokenizer_config: read("tokenizer_config.json")?,
            tokenizer_json: read("tokenizer.json")?,
        })
    }
}

/// Caller settings that override the configs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepSettings {
    /// gemma4 `max_soft_tokens` ∈ {70,140,280,560,1120}; default: processor config, else
    /// `config.json` `vision_soft_tokens_per_image`, else 280.
    pub max_soft_tokens: Option<u32>,
    /// glm5_next `max_image_tokens` (upper token budget); default: processor config, else 8000.
    pub max_image_tokens: Option<u64>,
    /// Admission limits.
    pub limits: crate::source::AdmissionLimits,
    /// Split a large baseline JPEG's decode into row bands, resize rows and step3p7 tiles over
    /// the rayon pool (default true; false = one thread). The bytes are the same either way.
    pub parallel: bool,
    /// Refuse to prepare when the output tensors would exceed this many bytes (default 2 GiB).
    pub max_output_bytes: u64,
    /// Bytes of intermediate buffers (decoded image, resize passes, views) a `Preprocessor` keeps
    /// between calls to reuse, instead of faulting in fresh pages per image (default 256 MiB;
    /// 0 keeps none).
    pub scratch_bytes: usize,
    /// Bytes of output tensors a `Preprocessor` keeps when the caller hands them back with
    /// `Preprocessor::recycle`, to write the next outputs into (default 256 MiB; 0 keeps none).
    pub output_pool_bytes: usize,
}

/// Default output budget: 2 GiB of tensors per image.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 2 << 30;
/// Default scratch kept by a preprocessor: 256 MiB (a 12 MP photo's intermediates are ~110 MB).
pub const DEFAULT_SCRATCH_BYTES: usize = 256 << 20;
/// Default output pool: 256 MiB (five glm tensors of a 1920×1080 image).
pub const DEFAULT_OUTPUT_POOL_BYTES: usize = 256 << 20;

impl Default for PrepSettings {
    fn default() -> Self {
        PrepSettings {
            max_soft_tokens: None,
            max_image_tokens: None,
            limits: crate::source::AdmissionLimits::default(),
            parallel: true,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            scratch_bytes: DEFAULT_SCRATCH_BYTES,
            output_pool_bytes: DEFAULT_OUTPUT_POOL_BYTES,
        }
    }
}

/// Largest size-like config value accepted (patch sizes, merge sizes, view sides, caps).
pub const MAX_CONFIG_SIDE: u32 = 1 << 16;
/// Largest token or pixel budget accepted (`max_image_tokens`, glm46v `size.*_edge`).
pub const MAX_CONFIG_TOKENS: u64 = 1 << 32;
/// Largest derived alignment factor (gemma4 `k·p`, glm `p·merge·expand`) and temporal patch size accepted.
pub const MAX_ALIGN_FACTOR: u64 = 4096;

fn cfg_err(file: &str, reason: impl Into<String>) -> PrepError {
    PrepError::Config {
        file: file.into(),
        reason: reason.into(),
    }
}

/// The image-processor dict the way `AutoImageProcessor` picks it (image_processing_base.py:337-345):
/// `processor_config.json["image_processor"]` if present, else `preprocessor_config.json`.
pub fn image_processor_dict(cfg: &ModelConfigs) -> Option<(&'static str, &Value)> {
    if let Some(p) = cfg
        .processor_config
        .as_ref()
        .and_then(|p| p.get("image_processor"))
    {
        return Some(("processor_config.json", p));
    }
    cfg.preprocessor_config
        .as_ref()
        .map(|p| ("preprocessor_config.json", p))
}

struct Fields<'a> {
    file: &'static str,
    v: Option<&'a Value>,
}

impl Fields<'_> {
    fn u64(&self, key: &str) -> Result<Option<u64>> {
        match self.v.and_then(|v| v.get(key)) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .or_else(|| {
                    x.as_f64()
                        .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                        .map(|f| f as u64)
                })
                .map(Some)
                .ok_or_else(|| {
                    cfg_err(
                        self.file,
                        format!("`{key}` must be a non-negative integer, found {x}"),
                    )
                }),
        }
    }
    fn u32(&self, key: &str, default: u32) -> Result<u32> {
        match self.u64(key)? {
            None => Ok(default),
            Some(v) => u32::try_from(v)
                .ok()
                // Bounded so every product in the laws stays far from overflow.
                .filter(|v| *v > 0 && *v <= MAX_CONFIG_SIDE)
                .ok_or_else(|| cfg_err(self.file, format!("`{key}` = {v} out of range"))),
        }
    }
    fn f64(&self, key: &str, default: f64) -> Result<f64> {
        match self.v.and_then(|v| v.get(key)) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x
                .as_f64()
                .ok_or_else(|| cfg_err(self.file, format!("`{key}` must be a number"))),
        }
    }
    fn triple(&self, key: &str, default: [f64; 3]) -> Result<[f64; 3]> {
        match self.v.and_then(|v| v.get(key)) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Number(n)) => n
                .as_f64()
                .map(|f| [f; 3])
                .ok_or_else(|| cfg_err(self.file, format!("`{key}`"))),
            Some(Value::Array(a)) if a.len() == 3 => {
                let mut out = [0.0; 3];
                for (o, x) in out.iter_mut().zip(a) {
                    *o = x
                        .as_f64()
                        .ok_or_else(|| cfg_err(self.file, format!("`{key}` must hold numbers")))?;
                }
                Ok(out)
            }
            Some(x) => Err(cfg_err(
                self.file,
                format!("`{key}` must be a number or 3 numbers, found {x}"),
            )),
        }
    }
    fn filter(&self, default: Filter) -> Result<Filter> {
        match self.v.and_then(|v| v.get("resample")) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x.as_i64().and_then(Filter::from_pil_code).ok_or_else(|| {
                cfg_err(
                    self.file,
                    format!("`resample` = {x}: only BILINEAR (2) and BICUBIC (3) are implemented"),
                )
            }),
        }
    }
    fn flag(&self, key: &str) -> Result<()> {
        match self.v.and_then(|v| v.get(key)) {
            None | Some(Value::Null) | Some(Value::Bool(true)) => Ok(()),
            Some(x) => Err(cfg_err(
                self.file,
                format!("`{key}` = {x} is not supported (the vendor processors use true)"),
            )),
        }
    }
    fn size_key(&self, key: &str) -> Result<Option<u64>> {
        match self.v.and_then(|v| v.get("size")).and_then(|s| s.get(key)) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .map(Some)
                .ok_or_else(|| cfg_err(self.file, format!("`size.{key}` must be an integer"))),
        }
    }
}

/// Default class per `config.json` `model_type` (transformers auto image-processor map), used only
/// when the processor config names no class.
fn class_for_model_type(mt: &str) -> Option<&'static str> {
    match mt {
        "gemma4" => Some("Gemma4ImageProcessor"),
        "glm5_next" => Some("Glm5NextImageProcessor"),
        "glm46v" | "glm4v" | "glm_ocr" => Some("Glm46VImageProcessor"),
        "step3p7" => Some("Step3p7ImageProcessor"),
        _ => None,
    }
}

/// Build the law named by the configs, with the configs' own sizes and budgets, then apply `settings`.
pub fn law_from_configs(cfg: &ModelConfigs, settings: &PrepSettings) -> Result<Law> {
    let picked = image_processor_dict(cfg);
    let (file, dict) = match picked {
        Some((f, d)) => (f, Some(d)),
        None => ("config.json", None),
    };
    let named = dict
        .and_then(|d| d.get("image_processor_type"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let class = match named {
        Some(c) => c,
        None => {
            let mt = cfg
                .config
                .as_ref()
                .and_then(|c| c.get("model_type"))
                .and_then(Value::as_str)
                .unwrap_or("");
            class_for_model_type(mt).map(str::to_owned).ok_or_else(|| {
                cfg_err(
                    file,
                    format!("no `image_processor_type` and no known model_type (`{mt}`)"),
                )
            })?
        }
    };
    // Legacy "...Fast" names map to the same torchvision class (image_processing_auto.py:670-672).
    let base = class.strip_suffix("Fast").unwrap_or(&class);
    let f = Fields { file, v: dict };
    for key in ["do_resize", "do_rescale", "do_convert_rgb"] {
        f.flag(key)?;
    }
    let law = match base {
        "Gemma4ImageProcessor" => {
            if let Some(Value::Bool(true)) = dict.and_then(|d| d.get("do_normalize")) {
                return Err(cfg_err(
                    file,
                    "`do_normalize` = true is not supported for gemma4",
                ));
            }
            let from_model = cfg
                .config
                .as_ref()
                .and_then(|c| c.get("vision_soft_tokens_per_image"))
                .and_then(Value::as_u64)
                .and_then(|v| u32::try_from(v).ok());
            let mst = settings
                .max_soft_tokens
                .or(f
                    .u64("max_soft_tokens")?
                    .and_then(|v| u32::try_from(v).ok()))
                .or(from_model)
                .unwrap_or(280);
            if !GEMMA4_SUPPORTED_SOFT_TOKENS.contains(&mst) {
                return Err(PrepError::BadSetting(format!(
                    "max_soft_tokens must be one of {GEMMA4_SUPPORTED_SOFT_TOKENS:?}, got {mst}"
                )));
            }
            let d = Gemma4Law::default();
            Law::Gemma4(Gemma4Law {
                patch_size: f.u32("patch_size", d.patch_size)?,
                pooling_kernel_size: f.u32("pooling_kernel_size", d.pooling_kernel_size)?,
                max_soft_tokens: mst,
                filter: f.filter(d.filter)?,
                rescale_factor: f.f64("rescale_factor", d.rescale_factor)?,
            })
        }
        "Glm5NextImageProcessor" => {
            f.flag("do_normalize")?;
            let d = Glm5NextLaw::default();
            let max_t = settings
                .max_image_tokens
                .or(f.u64("max_image_tokens")?)
                .unwrap_or(d.max_image_tokens);
            let min_t = f.u64("min_image_tokens")?.unwrap_or(d.min_image_tokens);
            if max_t == 0 || min_t > max_t || max_t > MAX_CONFIG_TOKENS {
                return Err(PrepError::BadSetting(format!(
                    "image token budget {min_t}..{max_t} is empty"
                )));
            }
            Law::Glm5Next(Glm5NextLaw {
                patch_size: f.u32("patch_size", d.patch_size)?,
                temporal_patch_size: f.u32("temporal_patch_size", d.temporal_patch_size)?,
                merge_size: f.u32("merge_size", d.merge_size)?,
                patch_expand_factor: f.u32("patch_expand_factor", d.patch_expand_factor)?,
                min_image_tokens: min_t,
                max_image_tokens: max_t,
                filter: f.filter(d.filter)?,
                mean: f.triple("image_mean", d.mean)?,
                std: f.triple("image_std", d.std)?,
                rescale_factor: f.f64("rescale_factor", d.rescale_factor)?,
            })
        }
        "Glm46VImageProcessor" => {
            f.flag("do_normalize")?;
            let d = Glm46VLaw::default();
            let law = Glm46VLaw {
                patch_size: f.u32("patch_size", d.patch_size)?,
                temporal_patch_size: f.u32("temporal_patch_size", d.temporal_patch_size)?,
                merge_size: f.u32("merge_size", d.merge_size)?,
                shortest_edge: f
                    .size_key("shortest_edge")?
                    .unwrap_or(d.shortest_edge)
                    .min(MAX_CONFIG_TOKENS),
                longest_edge: f
                    .size_key("longest_edge")?
                    .unwrap_or(d.longest_edge)
                    .min(MAX_CONFIG_TOKENS),
                filter: f.filter(d.filter)?,
                mean: f.triple("image_mean", d.mean)?,
                std: f.triple("image_std", d.std)?,
                rescale_factor: f.f64("rescale_factor", d.rescale_factor)?,
            };
            Law::Glm46V(law)
        }
        "Step3p7ImageProcessor" => {
            f.flag("do_normalize")?;
            let d = Step3p7Law::default();
            let h = f.size_key("height")?.unwrap_or(u64::from(d.image_size));
            let w = f.size_key("width")?.unwrap_or(h);
            if h != w {
                return Err(cfg_err(
                    file,
                    format!("step3p7 global view must be square, got {w}x{h}"),
                ));
            }
            // Bounded like every other side: 0 would resize to nothing, 2³²−1 overflows the
            // plan's 3·side² (transformers would try to allocate it).
            let image_size = u32::try_from(h)
                .ok()
                .filter(|s| (1..=MAX_CONFIG_SIDE).contains(s))
                .ok_or_else(|| {
                    cfg_err(
                        file,
                        format!("`size.height` = {h} out of range (1..={MAX_CONFIG_SIDE})"),
                    )
                })?;
            Law::Step3p7(Step3p7Law {
                image_size,
                patch_size: f.u32("patch_size", d.patch_size)?,
                max_image_size: f.u32("max_image_size", d.max_image_size)?,
                vision_patch_size: f.u32("vision_patch_size", d.vision_patch_size)?,
                downsampler_stride: f.u32("downsampler_stride", d.downsampler_stride)?,
                filter: f.filter(d.filter)?,
                mean: f.triple("image_mean", d.mean)?,
                std: f.triple("image_std", d.std)?,
                rescale_factor: f.f64("rescale_factor", d.rescale_factor)?,
            })
        }
        other => return Err(PrepError::UnknownProcessor(other.to_owned())),
    };
    check_law_bounds(file, &law)?;
    Ok(law)
}

/// The bounds every law's derived factors must meet (alignment `≤` [`MAX_ALIGN_FACTOR`],
/// temporal patch `≤ 16`), whatever built it; `file` names the source in the error.
pub(crate) fn check_law_bounds(file: &str, law: &Law) -> Result<()> {
    let (align, temporal) = match law {
        Law::Gemma4(l) => (
            u64::from(l.pooling_kernel_size) * u64::from(l.patch_size),
            1,
        ),
        Law::Glm5Next(l) => (
            u64::from(l.patch_size) * u64::from(l.merge_size) * u64::from(l.patch_expand_factor),
            u64::from(l.temporal_patch_size),
        ),
        Law::Glm46V(l) => (
            u64::from(l.patch_size) * u64::from(l.merge_size),
            u64::from(l.temporal_patch_size),
        ),
        Law::Step3p7(l) => (
            u64::from(l.vision_patch_size) * u64::from(l.downsampler_stride),
            1,
        ),
    };
    if align > MAX_ALIGN_FACTOR || temporal > 16 {
        return Err(cfg_err(
            file,
            format!("alignment factor {align} / temporal patch {temporal} out of range"),
        ));
    }
    Ok(())
}

/// A prompt token: its text and, when found in the configs, its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// Token text, e.g. `<|image|>`.
    pub text: String,
    /// Token id; `None` = "token id unknown": neither `config.json` nor the tokenizer files have it.
    pub id: Option<u32>,
}

fn id_in_added_tokens(cfg: &ModelConfigs, text: &str) -> Option<u32> {
    if let Some(Value::Object(map)) = cfg
        .tokenizer_config
        .as_ref()
        .and_then(|t| t.get("added_tokens_decoder"))
    {
        for (k, v) in map {
            if v.get("content").and_then(Value::as_str) == Some(text) {
                if let Ok(id) = k.parse::<u32>() {
                    return Some(id);
                }
            }
        }
    }
    if let Some(Value::Array(list)) = cfg
        .tokenizer_json
        .as_ref()
        .and_then(|t| t.get("added_tokens"))
    {
        for v in list {
            if v.get("content").and_then(Value::as_str) == Some(text) {
                if let Some(id) = v
                    .get("id")
                    .and_then(Value::as_u64)
                    .and_then(|i| u32::try_from(i).ok())
                {
                    return Some(id);
                }
            }
        }
    }
    // Regular vocabulary entries (e.g. step3p7's `<im_patch>` may be a plain vocab token).
    cfg.tokenizer_json
        .as_ref()
        .and_then(|t| t.get("model"))
        .and_then(|m| m.get("vocab"))
        .and_then(|v| v.get(text))
        .and_then(Value::as_u64)
        .and_then(|i| u32::try_from(i).ok())
}

/// The tokenizer's own text for a named special token (`tokenizer_config.json` `boi_token` etc.,
/// either a string or `{"content": …}`, possibly under `extra_special_tokens`).
fn tokenizer_text(cfg: &ModelConfigs, attr: &str) -> Option<String> {
    let tc = cfg.tokenizer_config.as_ref()?;
    let pick = |v: &Value| -> Option<String> {
        v.as_str()
            .map(str::to_owned)
            .or_else(|| v.get("content").and_then(Value::as_str).map(str::to_owned))
    };
    tc.get(attr).and_then(pick).or_else(|| {
        tc.get("extra_special_tokens")
            .and_then(|e| e.get(attr))
            .and_then(pick)
    })
}

/// Resolve a token: the text from the tokenizer attribute (else `default_text`); the id from
/// `config.json[config_key]` (top level or `text_config`), else the tokenizer files by text.
pub fn resolve_token(
    cfg: &ModelConfigs,
    tokenizer_attr: Option<&str>,
    default_text: &str,
    config_key: Option<&str>,
) -> Token {
    let text = tokenizer_attr
        .and_then(|a| tokenizer_text(cfg, a))
        .unwrap_or_else(|| default_text.to_owned());
    let from_config = config_key.and_then(|k| {
        let c = cfg.config.as_ref()?;
        c.get(k)
            .or_else(|| c.get("text_config").and_then(|t| t.get(k)))
            .and_then(Value::as_u64)
            .and_then(|i| u32::try_from(i).ok())
    });
    let id = from_config.or_else(|| id_in_added_tokens(cfg, &text));
    Token { text, id }
}

/// The prompt tokens one law writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptTokens {
    /// gemma4: `<boi>` + n × image + `<eoi>` (processing_gemma4.py:199-201).
    Gemma4 {
        /// Begin-of-image (`boi_token_id`).
        boi: Token,
        /// Soft-token placeholder (`image_token_id`).
        image: Token,
        /// End-of-image (`eoi_token_id`).
        eoi: Token,
    },
    /// glm5_next / glm46v: n × `<|image|>` (processing_glm5_next.py:57-60, processing_glm46v.py:56-59).
    Glm {
        /// `<|image|>` (`image_token_id`).
        image: Token,
    },
    /// step3p7 (processing_step3p7.py:49-60).
    Step3p7 {
        /// `<patch_start>`.
        patch_start: Token,
        /// `<patch_end>`.
        patch_end: Token,
        /// `<patch_newline>`.
        patch_newline: Token,
        /// `<im_start>`.
        im_start: Token,
        /// `<im_end>`.
        im_end: Token,
        /// `<im_patch>` (`image_token_id`).
        im_patch: Token,
    },
}

impl PromptTokens {
    /// Every token of the table.
    pub fn all(&self) -> Vec<&Token> {
        match self {
            PromptTokens::Gemma4 { boi, image, eoi } => vec![boi, image, eoi],
            PromptTokens::Glm { image } => vec![image],
            PromptTokens::Step3p7 {
                patch_start,
                patch_end,
                patch_newline,
                im_start,
                im_end,
                im_patch,
            } => vec![
                patch_start,
                patch_end,
                patch_newline,
                im_start,
                im_end,
                im_patch,
            ],
        }
    }
}

/// Token table for `law`, from the configs.
pub fn tokens_for(law: &Law, cfg: &ModelConfigs) -> PromptTokens {
    match law {
        Law::Gemma4(_) => PromptTokens::Gemma4 {
            boi: resolve_token(cfg, Some("boi_token"), "<|image>", Some("boi_token_id")),
            image: resolve_token(
                cfg,
                Some("image_token"),
                "<|image|>",
                Some("image_token_id"),
            ),
            eoi: resolve_token(cfg, Some("eoi_token"), "<image|>", Some("eoi_token_id")),
        },
        Law::Glm5Next(_) | Law::Glm46V(_) => PromptTokens::Glm {
            image: resolve_token(
                cfg,
                Some("image_token"),
                "<|image|>",
                Some("image_token_id"),
            ),
        },
        Law::Step3p7(_) => PromptTokens::Step3p7 {
            patch_start: resolve_token(cfg, None, "<patch_start>", None),
            patch_end: resolve_token(cfg, None, "<patch_end>", None),
            patch_newline: resolve_token(cfg, None, "<patch_newline>", None),
            im_start: resolve_token(cfg, None, "<im_start>", None),
            im_end: resolve_token(cfg, None, "<im_end>", None),
            im_patch: resolve_token(cfg, None, "<im_patch>", Some("image_token_id")),
        },
    }
}
