//! The GLM vision towers' dimensions and laws, from an HF `config.json` (`vision_config`).
//!
//! glm5_next and glm_ocr run one program; the config states their differences: the SwiGLU
//! clamp (glm5_next `swiglu_limit`, glm_ocr none) and the merger's inner width
//! (glm5_next `projection_intermediate_size`, glm_ocr `out_hidden_size · in_channels`).

use crate::error::{GlmError, Result};
use serde_json::Value;
use st_reader::config::{activation, opt_bool, opt_f64, opt_usize};
use tower_core::{config, Activation};

/// transformers `Glm5NextVisionConfig` / `GlmOcrVisionConfig` `depth` default.
pub const DEFAULT_DEPTH: usize = 24;
/// transformers glm vision configs: `hidden_size` default.
pub const DEFAULT_HIDDEN_SIZE: usize = 1024;
/// transformers glm vision configs: `num_heads` default.
pub const DEFAULT_NUM_HEADS: usize = 16;
/// transformers glm vision configs: `intermediate_size` default.
pub const DEFAULT_INTERMEDIATE_SIZE: usize = 4096;
/// transformers glm vision configs: `out_hidden_size` default (configuration_glm5_next.py:257,
/// configuration_glm_ocr.py:66); real checkpoints state the LM width.
pub const DEFAULT_OUT_HIDDEN_SIZE: usize = 1536;
/// transformers glm vision configs: `in_channels` default.
pub const DEFAULT_IN_CHANNELS: usize = 3;
/// transformers glm vision configs: `patch_size` default.
pub const DEFAULT_PATCH_SIZE: usize = 14;
/// transformers glm vision configs: `temporal_patch_size` default.
pub const DEFAULT_TEMPORAL_PATCH_SIZE: usize = 2;
/// transformers glm vision configs: `spatial_merge_size` default.
pub const DEFAULT_SPATIAL_MERGE_SIZE: usize = 2;
/// transformers glm vision configs: `rms_norm_eps` default (every vision RMSNorm, q/k norms too).
pub const DEFAULT_RMS_NORM_EPS: f64 = 1e-5;
/// transformers glm vision configs: `hidden_act` default (block MLP and merger SwiGLU gate).
pub const DEFAULT_HIDDEN_ACT: &str = "silu";
/// transformers glm vision configs: `attention_bias` default (qkv, proj and the block MLP:
/// `Glm5NextVisionMLP(config, bias=config.attention_bias)`, modeling_glm5_next.py:1702).
pub const DEFAULT_ATTENTION_BIAS: bool = true;
/// transformers `modeling_rope_utils.py:760`: axial rope θ when `rope_parameters` has none.
pub const DEFAULT_ROPE_THETA: f64 = 10000.0;
/// transformers `Glm5NextVisionConfig.swiglu_limit` default (configuration_glm5_next.py:263).
pub const DEFAULT_SWIGLU_LIMIT: f64 = 10.0;
/// transformers `Glm5NextVisionConfig.projection_intermediate_size` default
/// (configuration_glm5_next.py:262).
pub const DEFAULT_PROJECTION_INTERMEDIATE_SIZE: usize = 10240;
/// The merger's `post_projection_norm` is a plain `torch.nn.LayerNorm(dim)` (modeling_glm5_next.py:1547,
/// modeling_glm_ocr.py:462): eps is torch's default 1e-5, not the config's `rms_norm_eps`.
pub const MERGER_LAYER_NORM_EPS: f64 = 1e-5;

/// Largest width any single dimension may state (real releases are ≤ 10240): keeps every
/// product the loader forms (`3H`, `O·H·m²`, `C·T·p²`) far from overflow on a hostile config.
pub const MAX_DIMENSION: usize = 1 << 20;
/// Most vision blocks (`depth`) a config may state (releases have 24; generous on purpose):
/// [`MAX_DIMENSION`] alone would admit 10⁶, and the loader walks every configured block.
pub const MAX_LAYERS: usize = 1024;

/// Which GLM vision family the checkpoint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlmFamily {
    /// `glm5_next` (`Glm5NextVisionModel`): clamped SwiGLU, merger width `projection_intermediate_size`.
    Glm5Next,
    /// `glm_ocr` (`GlmOcrVisionModel`): plain SwiGLU, merger width `out_hidden_size · in_channels`.
    GlmOcr,
}

impl GlmFamily {
    /// The `model_type` of the whole model.
    pub fn model_type(self) -> &'static str {
        match self {
            GlmFamily::Glm5Next => "glm5_next",
            GlmFamily::GlmOcr => "glm_ocr",
        }
    }

    fn from_model_type(t: &str) -> Option<GlmFamily> {
        match t {
            "glm5_next" | "glm5_next_vision" => Some(GlmFamily::Glm5Next),
            "glm_ocr" | "glm_ocr_vision" => Some(GlmFamily::GlmOcr),
            _ => None,
        }
    }
}

/// Dimensions and laws of one GLM vision tower.
#[derive(Debug, Clone, PartialEq)]
pub struct GlmConfig {
    /// The family (from `model_type`).
    pub family: GlmFamily,
    /// Vision hidden width H.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Head dimension `H / heads`.
    pub head_dim: usize,
    /// Vision blocks (`depth`).
    pub layers: usize,
    /// Block MLP inner width.
    pub intermediate: usize,
    /// Downsample and merger width O (`out_hidden_size`, the LM's hidden width: `text_hidden`,
    /// as in every family's config).
    pub text_hidden: usize,
    /// Merger SwiGLU inner width (glm5_next `projection_intermediate_size`; glm_ocr `O·in_channels`).
    pub merger_inner: usize,
    /// Image channels.
    pub in_channels: usize,
    /// Patch side p.
    pub patch: usize,
    /// Frames per temporal patch.
    pub temporal_patch: usize,
    /// Spatial merge m (the downsample is an m×m stride-m conv).
    pub merge: usize,
    /// RMSNorm epsilon (norm1, norm2, q/k norms, post_layernorm).
    pub eps: f64,
    /// Axial rope θ.
    pub rope_theta: f64,
    /// SwiGLU clamp L (`silu(min(g, L))·clamp(u, −L, L)`), block MLP and merger; `None` for glm_ocr.
    pub swiglu_limit: Option<f32>,
    /// The SwiGLU gate activation (`hidden_act`).
    pub activation: Activation,
    /// qkv, proj and block MLP carry biases.
    pub attention_bias: bool,
}

impl GlmConfig {
    /// Width of one pixel row: `in_channels · temporal_patch · p²` (1176 in every release).
    pub fn patch_dim(&self) -> usize {
        self.in_channels * self.temporal_patch * self.patch * self.patch
    }

    /// Tokens merged into one output row: m².
    pub fn merge_unit(&self) -> usize {
        self.merge * self.merge
    }

    /// Reads the whole model's `config.json` (`model_type` + `vision_config`).
    pub fn from_hf(config: &Value) -> Result<GlmConfig> {
        let v = config
            .get("vision_config")
            .ok_or_else(|| GlmError::Config("config.json has no vision_config".into()))?;
        let top = config.get("model_type").and_then(Value::as_str);
        let inner = v.get("model_type").and_then(Value::as_str);
        let family = match (top.map(GlmFamily::from_model_type), inner.map(GlmFamily::from_model_type)) {
            (Some(Some(a)), Some(Some(b))) if a != b => {
                return Err(GlmError::Config(format!(
                    "model_type {top:?} disagrees with vision_config.model_type {inner:?}"
                )))
            }
            (Some(Some(f)), _) | (None, Some(Some(f))) => f,
            (Some(None), _) | (None, Some(None)) | (None, None) => {
                return Err(GlmError::Config(format!(
                    "model_type {top:?} / vision_config.model_type {inner:?} is not glm5_next or glm_ocr"
                )))
            }
        };
        let hidden = opt_usize(v, "hidden_size")?.unwrap_or(DEFAULT_HIDDEN_SIZE);
        let heads = opt_usize(v, "num_heads")?.unwrap_or(DEFAULT_NUM_HEADS);
        let text_hidden = opt_usize(v, "out_hidden_size")?.unwrap_or(DEFAULT_OUT_HIDDEN_SIZE);
        let in_channels = opt_usize(v, "in_channels")?.unwrap_or(DEFAULT_IN_CHANNELS);
        let rope = v.get("rope_parameters").filter(|r| !r.is_null());
        if let Some(kind) = rope
            .and_then(|r| r.get("rope_type"))
            .and_then(Value::as_str)
        {
            // Glm5NextVisionRotaryEmbedding raises for anything but axial.
            if kind != "axial" {
                return Err(GlmError::Config(format!(
                    "rope_type {kind:?}: the glm vision rope is axial only"
                )));
            }
        }
        let rope_theta = match rope.and_then(|r| r.get("rope_theta")) {
            None | Some(Value::Null) => DEFAULT_ROPE_THETA,
            Some(x) => x.as_f64().ok_or_else(|| {
                GlmError::Config(format!("rope_parameters.rope_theta = {x} is not a number"))
            })?,
        };
        let (swiglu_limit, merger_inner) = match family {
            GlmFamily::Glm5Next => {
                let l = opt_f64(v, "swiglu_limit")?.unwrap_or(DEFAULT_SWIGLU_LIMIT);
                if !(l.is_finite() && l > 0.0) {
                    return Err(GlmError::Config(format!(
                        "swiglu_limit {l} must be positive"
                    )));
                }
                let pi = opt_usize(v, "projection_intermediate_size")?
                    .unwrap_or(DEFAULT_PROJECTION_INTERMEDIATE_SIZE);
                (Some(l as f32), pi)
            }
            // GlmOcrVisionModel: merger context_dim = out_hidden_size · in_channels
            // (modeling_glm_ocr.py:575), unclamped (modeling_glm_ocr.py:459-473).
            GlmFamily::GlmOcr => (
                None,
                text_hidden.checked_mul(in_channels).ok_or_else(|| {
                    GlmError::Config("out_hidden_size · in_channels overflows".into())
                })?,
            ),
        };
        let cfg = GlmConfig {
            family,
            hidden,
            heads,
            head_dim: hidden.checked_div(heads).unwrap_or(0),
            layers: opt_usize(v, "depth")?.unwrap_or(DEFAULT_DEPTH),
            intermediate: opt_usize(v, "intermediate_size")?.unwrap_or(DEFAULT_INTERMEDIATE_SIZE),
            text_hidden,
            merger_inner,
            in_channels,
            patch: opt_usize(v, "patch_size")?.unwrap_or(DEFAULT_PATCH_SIZE),
            temporal_patch: opt_usize(v, "temporal_patch_size")?
                .unwrap_or(DEFAULT_TEMPORAL_PATCH_SIZE),
            merge: opt_usize(v, "spatial_merge_size")?.unwrap_or(DEFAULT_SPATIAL_MERGE_SIZE),
            eps: opt_f64(v, "rms_norm_eps")?.unwrap_or(DEFAULT_RMS_NORM_EPS),
            rope_theta,
            swiglu_limit,
            activation: activation(v, "hidden_act", DEFAULT_HIDDEN_ACT)?,
            attention_bias: opt_bool(v, "attention_bias")?.unwrap_or(DEFAULT_ATTENTION_BIAS),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(GlmError::Config(m));
        let dims = [
            self.hidden,
            self.heads,
            self.layers,
            self.intermediate,
            self.text_hidden,
            self.merger_inner,
            self.in_channels,
            self.patch,
            self.temporal_patch,
        ];
        if dims.contains(&0) {
            return bad(format!("zero dimension in {self:?}"));
        }
        if dims.iter().any(|&d| d > MAX_DIMENSION) {
            return bad(format!("a dimension exceeds {MAX_DIMENSION} in {self:?}"));
        }
        if self.layers > MAX_LAYERS {
            return bad(format!(
                "depth {} exceeds the limit of {MAX_LAYERS} blocks",
                self.layers
            ));
        }
        let pd = [self.temporal_patch, self.patch, self.patch]
            .iter()
            .try_fold(self.in_channels, |a, &b| a.checked_mul(b));
        if pd.is_none_or(|pd| pd > MAX_DIMENSION) {
            return bad(format!(
                "pixel row width in_channels·temporal_patch_size·patch_size² exceeds {MAX_DIMENSION}"
            ));
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return bad(format!(
                "hidden_size {} is not a multiple of num_heads {}",
                self.hidden, self.heads
            ));
        }
        if !self.head_dim.is_multiple_of(4) {
            return bad(format!(
                "head_dim {} must be a multiple of 4 (2-D rope: hd/4 frequencies per axis)",
                self.head_dim
            ));
        }
        // The downsample is gathered by gpu-core's 2×2 block gather (the only merge any
        // release uses); another m would need another gather law.
        if self.merge != 2 {
            return bad(format!(
                "spatial_merge_size {} is not supported (only 2)",
                self.merge
            ));
        }
        Ok(config::positive_eps_theta(
            "rms_norm_eps",
            self.eps,
            self.rope_theta,
        )?)
    }
}
