//! The Step-3.7 vision tower's dimensions and laws, from an HF `config.json` (`vision_config`,
//! transformers 5.23 `Step3p7VisionConfig`, `configuration_step3p7.py:30-74`).

use crate::error::{Result, StepError};
use serde_json::Value;
use st_reader::config::{activation, opt_bool, opt_f64, opt_usize};
use tower_core::{config, Activation};

/// `Step3p7VisionConfig.hidden_size` default (configuration_step3p7.py).
pub const DEFAULT_HIDDEN: usize = 1536;
/// `Step3p7VisionConfig.num_hidden_layers` default.
pub const DEFAULT_LAYERS: usize = 47;
/// `Step3p7VisionConfig.num_attention_heads` default.
pub const DEFAULT_HEADS: usize = 16;
/// `Step3p7VisionConfig.mlp_ratio` default: `8960 / 1536`; `intermediate_size` is then
/// **recomputed** as `int(hidden_size · mlp_ratio)` in `__post_init__` (a passed
/// `intermediate_size` is overwritten).
pub const DEFAULT_MLP_RATIO: f64 = 8960.0 / 1536.0;
/// `Step3p7VisionConfig.image_size` default (the position table is `(image_size/patch)²` rows).
pub const DEFAULT_IMAGE_SIZE: usize = 728;
/// `Step3p7VisionConfig.patch_size` default.
pub const DEFAULT_PATCH_SIZE: usize = 14;
/// `Step3p7VisionConfig.num_channels` default (the only value the tower supports).
pub const NUM_CHANNELS: usize = 3;
/// `Step3p7VisionConfig.layer_norm_eps` default (every LayerNorm, all with bias).
pub const DEFAULT_LAYER_NORM_EPS: f64 = 1e-5;
/// `Step3p7VisionConfig.hidden_act` default (`x·σ(1.702x)`).
pub const DEFAULT_ACTIVATION: &str = "quick_gelu";
/// Axial rope θ: `RotaryEmbeddingConfigMixin` default `rope_theta` for `default_rope_type = "axial"`.
pub const DEFAULT_ROPE_THETA: f64 = 10000.0;
/// `Step3p7Config.projector_bias` default (configuration_step3p7.py:324): the projector has no bias.
pub const DEFAULT_PROJECTOR_BIAS: bool = false;
/// `Step3p7VisionModel.downsampler{1,2}`: each 3×3 stride-2 conv doubles the width, so the
/// tower's output (the projector's input) is `hidden · 4` (modeling_step3p7.py:958).
pub const DOWNSAMPLE_WIDTH_FACTOR: usize = 4;
/// Most encoder layers a config may state (the release has 47; generous on purpose). A hostile
/// `num_hidden_layers` / `layers` is refused before anything is sized by it.
pub const MAX_LAYERS: usize = 1024;
/// Largest `image_size` accepted (the release uses 728; vision-prep's `MAX_CONFIG_SIDE`): keeps
/// the position table's `(image_size/patch)²` rows below 2³², far from overflow.
pub const MAX_IMAGE_SIZE: usize = 1 << 16;
/// Largest `patch_size` accepted (the release uses 14): keeps the patch row width 3·p² below
/// 2²⁶.
pub const MAX_PATCH_SIZE: usize = 1 << 12;

/// Dimensions and laws of one Step-3.7 vision tower.
#[derive(Debug, Clone, PartialEq)]
pub struct StepConfig {
    /// Vision hidden width H.
    pub hidden: usize,
    /// MLP inner width `int(H · mlp_ratio)`.
    pub intermediate: usize,
    /// Encoder layers.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Head dimension `H / heads` (`Step3p7VisionAttention.head_dim`).
    pub head_dim: usize,
    /// MLP activation.
    pub activation: Activation,
    /// LayerNorm epsilon.
    pub eps: f64,
    /// Axial rope θ.
    pub rope_theta: f64,
    /// Patch side in pixels.
    pub patch: usize,
    /// Side of the learned square position table, `image_size / patch`.
    pub pos_side: usize,
    /// Whether the projector has a bias (`Step3p7Config.projector_bias`).
    pub projector_bias: bool,
    /// The LM's hidden width (the projector's output, read from its tensor).
    pub text_hidden: usize,
    /// Whether the LM attends bidirectionally (`Step3p7TextConfig.use_bidirectional_attention`).
    pub lm_bidirectional: bool,
}

impl StepConfig {
    /// Width of one patch row: `3·p²`, flattened (c, ky, kx) like the conv weight (validated:
    /// `patch ≤` [`MAX_PATCH_SIZE`]; saturating all the same for a config built by hand).
    pub fn patch_dim(&self) -> usize {
        self.patch
            .saturating_mul(self.patch)
            .saturating_mul(NUM_CHANNELS)
    }

    /// Width of the tower's output rows (the projector's input): `4·H`.
    pub fn out_width(&self) -> usize {
        DOWNSAMPLE_WIDTH_FACTOR * self.hidden
    }

    /// Rows of the position table: `pos_side²` (validated: `pos_side ≤` [`MAX_IMAGE_SIZE`];
    /// saturating all the same for a config built by hand).
    pub fn pos_rows(&self) -> usize {
        self.pos_side.saturating_mul(self.pos_side)
    }

    /// Reads an HF `config.json` (whole model: `vision_config`, optional `text_config`);
    /// `text_hidden` comes from the projector tensor, which is checked against
    /// `text_config.hidden_size` when the config has one.
    pub fn from_hf(config: &Value, text_hidden: usize) -> Result<StepConfig> {
        let v = config
            .get("vision_config")
            .ok_or_else(|| StepError::Config("config.json has no vision_config".into()))?;
        // `__post_init__` pops the legacy keys over the fields (configuration_step3p7.py:69-72).
        let hidden = legacy_usize(v, "width", "hidden_size")?.unwrap_or(DEFAULT_HIDDEN);
        let layers = legacy_usize(v, "layers", "num_hidden_layers")?.unwrap_or(DEFAULT_LAYERS);
        let heads = legacy_usize(v, "heads", "num_attention_heads")?.unwrap_or(DEFAULT_HEADS);
        let mlp_ratio = opt_f64(v, "mlp_ratio")?.unwrap_or(DEFAULT_MLP_RATIO);
        let inter = hidden as f64 * mlp_ratio;
        if !(inter.is_finite() && inter >= 1.0) {
            return Err(StepError::Config(format!(
                "hidden_size {hidden} · mlp_ratio {mlp_ratio} is not a positive width"
            )));
        }
        // Python `int()` truncates toward zero; `inter` is positive here.
        let intermediate = inter.trunc() as usize;
        if let Some(c) = opt_usize(v, "num_channels")? {
            if c != NUM_CHANNELS {
                return Err(StepError::Config(format!(
                    "num_channels {c}: the tower supports only {NUM_CHANNELS}"
                )));
            }
        }
        let rope = v.get("rope_parameters");
        if let Some(kind) = rope
            .and_then(|r| r.get("rope_type"))
            .and_then(Value::as_str)
        {
            // Step3p7VisionRotaryEmbedding raises for anything but axial (modeling_step3p7.py:70).
            if kind != "axial" {
                return Err(StepError::Config(format!(
                    "rope_type {kind:?}: the vision tower supports only axial"
                )));
            }
        }
        let rope_theta = rope
            .and_then(|r| r.get("rope_theta"))
            .and_then(Value::as_f64)
            .unwrap_or(DEFAULT_ROPE_THETA);
        let patch = opt_usize(v, "patch_size")?.unwrap_or(DEFAULT_PATCH_SIZE);
        let image_size = opt_usize(v, "image_size")?.unwrap_or(DEFAULT_IMAGE_SIZE);
        if image_size > MAX_IMAGE_SIZE {
            return Err(StepError::Config(format!(
                "image_size {image_size} exceeds the limit of {MAX_IMAGE_SIZE}"
            )));
        }
        if let Some(t) = config.get("text_config").and_then(|t| t.get("hidden_size")) {
            let t = t.as_u64().and_then(|n| usize::try_from(n).ok());
            if t != Some(text_hidden) {
                return Err(StepError::Config(format!(
                    "text_config.hidden_size is {t:?} but the projector outputs {text_hidden}"
                )));
            }
        }
        let projector_bias = opt_bool(config, "projector_bias")?.unwrap_or(DEFAULT_PROJECTOR_BIAS);
        let lm_bidirectional = config
            .get("text_config")
            .and_then(|t| t.get("use_bidirectional_attention"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let cfg = StepConfig {
            hidden,
            intermediate,
            layers,
            heads,
            head_dim: hidden.checked_div(heads).unwrap_or(0),
            activation: activation(v, "hidden_act", DEFAULT_ACTIVATION)?,
            eps: v
                .get("layer_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(DEFAULT_LAYER_NORM_EPS),
            rope_theta,
            patch,
            pos_side: image_size.checked_div(patch).unwrap_or(0),
            projector_bias,
            text_hidden,
            lm_bidirectional,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(StepError::Config(m));
        if self.hidden == 0
            || self.heads == 0
            || self.layers == 0
            || self.intermediate == 0
            || self.text_hidden == 0
            || self.patch == 0
            || self.pos_side == 0
        {
            return bad(format!("zero dimension in {self:?}"));
        }
        config::layers_within(self.layers, MAX_LAYERS)?;
        if self.patch > MAX_PATCH_SIZE || self.pos_side > MAX_IMAGE_SIZE {
            return bad(format!(
                "patch_size {} / position table side {} exceed the limits {MAX_PATCH_SIZE} / {MAX_IMAGE_SIZE}",
                self.patch, self.pos_side
            ));
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return bad(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden, self.heads
            ));
        }
        if !self.head_dim.is_multiple_of(4) {
            return bad(format!(
                "head_dim {} must be a multiple of 4 (2-D rope over column and row pairs)",
                self.head_dim
            ));
        }
        Ok(config::positive_eps_theta(
            "eps",
            self.eps,
            self.rope_theta,
        )?)
    }
}

/// The legacy key when present (it wins, as `kwargs.pop(legacy, field)` does), else the field.
fn legacy_usize(v: &Value, legacy: &str, field: &str) -> Result<Option<usize>> {
    match opt_usize(v, legacy)? {
        Some(x) => Ok(Some(x)),
        None => Ok(opt_usize(v, field)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn intermediate_is_recomputed_from_mlp_ratio() {
        let c = json!({"vision_config": {"hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "mlp_ratio": 1.5, "intermediate_size": 3072}});
        let cfg = StepConfig::from_hf(&c, 80).unwrap();
        assert_eq!(cfg.intermediate, 96);
        assert_eq!(cfg.head_dim, 16);
        assert_eq!(cfg.pos_side, 52);
        // the release defaults: int(1536 · 8960/1536) = 8960
        let c = json!({"vision_config": {}});
        let cfg = StepConfig::from_hf(&c, 4096).unwrap();
        assert_eq!(
            (cfg.hidden, cfg.intermediate, cfg.head_dim),
            (1536, 8960, 96)
        );
    }

    #[test]
    fn legacy_keys_win_and_bad_values_are_config_errors() {
        let c = json!({"vision_config": {"width": 32, "hidden_size": 64, "heads": 2}});
        let cfg = StepConfig::from_hf(&c, 8).unwrap();
        assert_eq!((cfg.hidden, cfg.heads), (32, 2));
        let c = json!({"vision_config": {"rope_parameters": {"rope_type": "default"}}});
        assert!(matches!(
            StepConfig::from_hf(&c, 8),
            Err(StepError::Config(_))
        ));
        let c = json!({"vision_config": {}, "text_config": {"hidden_size": 80}});
        assert!(matches!(
            StepConfig::from_hf(&c, 81),
            Err(StepError::Config(_))
        ));
    }

    #[test]
    fn hostile_sizes_and_layer_counts_are_config_errors() {
        for (k, v) in [
            ("image_size", 1u64 << 40),
            ("image_size", MAX_IMAGE_SIZE as u64 + 1),
            ("patch_size", 1 << 33),
            ("num_hidden_layers", 1_000_000),
            ("num_hidden_layers", 1 << 40),
            ("layers", MAX_LAYERS as u64 + 1),
        ] {
            let c = json!({"vision_config": {"hidden_size": 64, "num_attention_heads": 4, k: v}});
            let got = StepConfig::from_hf(&c, 8);
            assert!(
                matches!(got, Err(StepError::Config(_))),
                "{k} = {v}: {got:?}"
            );
        }
        let c = json!({"vision_config": {"hidden_size": 64, "num_attention_heads": 4,
            "image_size": MAX_IMAGE_SIZE, "patch_size": 1, "num_hidden_layers": MAX_LAYERS}});
        let cfg = StepConfig::from_hf(&c, 8).unwrap();
        assert_eq!(cfg.pos_rows(), MAX_IMAGE_SIZE * MAX_IMAGE_SIZE);
    }
}
