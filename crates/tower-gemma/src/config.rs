//! The Gemma-4 vision tower's dimensions and laws, from an HF `config.json` or GGUF metadata.

use crate::error::{GemmaError, Result};
use gguf_reader::GgufFile;
use serde_json::Value;
use st_reader::config::{activation, opt_usize, req_usize};
use tower_core::{config, Activation};

/// transformers `Gemma4VisionConfig.rms_norm_eps` default (configuration_gemma4.py).
pub const DEFAULT_RMS_NORM_EPS: f64 = 1e-6;
/// transformers `Gemma4VisionConfig` axial rope default θ (`default_theta = 100.0`).
pub const DEFAULT_ROPE_THETA: f64 = 100.0;
/// transformers `Gemma4VisionConfig.pooling_kernel_size` default (k×k average pool).
pub const DEFAULT_POOLING_KERNEL: usize = 3;
/// transformers `Gemma4VisionConfig.patch_size` default.
pub const DEFAULT_PATCH_SIZE: usize = 16;
/// transformers `Gemma4VisionConfig.hidden_activation` default.
pub const DEFAULT_ACTIVATION: &str = "gelu_pytorch_tanh";
/// Most encoder layers a config may state (every release has ≤ 32; generous on purpose). A
/// hostile `num_hidden_layers` / `clip.vision.block_count` is refused before anything is sized
/// by it.
pub const MAX_LAYERS: usize = 1024;
/// Largest patch side accepted (releases use 16): keeps the patch row width 3·p² below 2²⁶, so
/// every product the loader forms with it stays far from overflow.
pub const MAX_PATCH_SIZE: usize = 1 << 12;

/// Which MLP activation the GGUF path uses when the file names none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GgufActivation {
    /// The model's own default (transformers: `gelu_pytorch_tanh`). The right answer.
    #[default]
    Model,
    /// llama.cpp's assumption for gemma4v mmproj files (`gelu_quick`), for bit-compatibility
    /// with llama.cpp outputs; it is not what the model was trained with.
    LlamaCppGeluQuick,
}

/// Dimensions and laws of one Gemma-4 vision tower.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmaConfig {
    /// Vision hidden width H.
    pub hidden: usize,
    /// MLP inner width.
    pub intermediate: usize,
    /// Encoder layers.
    pub layers: usize,
    /// Attention heads (kv heads equal heads in every released vision tower).
    pub heads: usize,
    /// Head dimension (a free field: 72 in the 31B release).
    pub head_dim: usize,
    /// MLP activation.
    pub activation: Activation,
    /// RMSNorm epsilon for every vision norm and the embedder's pre-projection norm.
    pub eps: f64,
    /// Axial rope θ.
    pub rope_theta: f64,
    /// Patch side in pixels.
    pub patch: usize,
    /// Pooling kernel k (k×k average).
    pub pool: usize,
    /// Rows of each axis' position table.
    pub pos_rows: usize,
    /// ClippableLinear clamps present.
    pub clipped: bool,
    /// `(h − std_bias)·std_scale` after pooling.
    pub standardize: bool,
    /// The LM's hidden width (the embedder's output).
    pub text_hidden: usize,
}

impl GemmaConfig {
    /// Width of one patch row: 3·p² (validated: `patch ≤` [`MAX_PATCH_SIZE`], so it cannot
    /// overflow; saturating all the same for a config built by hand).
    pub fn patch_dim(&self) -> usize {
        self.patch.saturating_mul(self.patch).saturating_mul(3)
    }

    /// Reads an HF `config.json` (whole model: `vision_config` + `text_config`).
    pub fn from_hf(config: &Value, pos_rows: usize, clipped_tensors: bool) -> Result<GemmaConfig> {
        let v = config
            .get("vision_config")
            .ok_or_else(|| GemmaError::Config("config.json has no vision_config".into()))?;
        let hidden = req_usize(v, "hidden_size")?;
        let heads = req_usize(v, "num_attention_heads")?;
        let head_dim = opt_usize(v, "head_dim")?.unwrap_or(hidden / heads.max(1));
        if let Some(kv) = opt_usize(v, "num_key_value_heads")? {
            if kv != heads {
                return Err(GemmaError::Config(format!(
                    "num_key_value_heads {kv} != num_attention_heads {heads}: grouped vision attention is not supported"
                )));
            }
        }
        let theta = v
            .get("rope_parameters")
            .and_then(|r| r.get("rope_theta"))
            .and_then(Value::as_f64)
            .unwrap_or(DEFAULT_ROPE_THETA);
        if let Some(kind) = v
            .get("rope_parameters")
            .and_then(|r| r.get("rope_type"))
            .and_then(Value::as_str)
        {
            if kind != "axial" {
                return Err(GemmaError::Config(format!(
                    "rope_type {kind:?}: the vision tower supports only axial"
                )));
            }
        }
        let clipped = v
            .get("use_clipped_linears")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if clipped != clipped_tensors {
            return Err(GemmaError::Config(format!(
                "use_clipped_linears is {clipped} but the clamp tensors are {}",
                if clipped_tensors { "present" } else { "absent" }
            )));
        }
        let text_hidden = config
            .get("text_config")
            .map(|t| req_usize(t, "hidden_size"))
            .transpose()?
            .ok_or_else(|| {
                GemmaError::Config("config.json has no text_config.hidden_size".into())
            })?;
        let cfg = GemmaConfig {
            hidden,
            intermediate: req_usize(v, "intermediate_size")?,
            layers: req_usize(v, "num_hidden_layers")?,
            heads,
            head_dim,
            activation: activation(v, "hidden_activation", DEFAULT_ACTIVATION)?,
            eps: v
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(DEFAULT_RMS_NORM_EPS),
            rope_theta: theta,
            patch: opt_usize(v, "patch_size")?.unwrap_or(DEFAULT_PATCH_SIZE),
            pool: opt_usize(v, "pooling_kernel_size")?.unwrap_or(DEFAULT_POOLING_KERNEL),
            pos_rows,
            clipped,
            standardize: v
                .get("standardize")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            text_hidden,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads llama.cpp mmproj metadata (`clip.vision.*`). What the file does not say takes the
    /// transformers default; clamps and standardisation follow the tensors present.
    pub fn from_gguf(
        g: &GgufFile,
        pos_rows: usize,
        clipped: bool,
        standardize: bool,
        activation: GgufActivation,
    ) -> Result<GemmaConfig> {
        let u = |k: &str| -> Result<usize> {
            let key = format!("clip.vision.{k}");
            g.get(&key)
                .and_then(|v| v.as_u64())
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| {
                    GemmaError::Config(format!("GGUF key {key} missing or not an unsigned integer"))
                })
        };
        let hidden = u("embedding_length")?;
        let heads = u("attention.head_count")?;
        let eps = g
            .get("clip.vision.attention.layer_norm_epsilon")
            .and_then(|v| v.as_f64())
            .unwrap_or(DEFAULT_RMS_NORM_EPS);
        // llama.cpp writes no activation key for gemma4v (and then runs gelu_quick).
        let act = match activation {
            GgufActivation::Model => config::activation("hidden_activation", DEFAULT_ACTIVATION)?,
            GgufActivation::LlamaCppGeluQuick => Activation::QuickGelu,
        };
        let cfg = GemmaConfig {
            hidden,
            intermediate: u("feed_forward_length")?,
            layers: u("block_count")?,
            heads,
            head_dim: hidden / heads.max(1),
            activation: act,
            eps,
            rope_theta: DEFAULT_ROPE_THETA,
            patch: u("patch_size").unwrap_or(DEFAULT_PATCH_SIZE),
            pool: DEFAULT_POOLING_KERNEL,
            pos_rows,
            clipped,
            standardize,
            text_hidden: u("projection_dim")?,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(GemmaError::Config(m));
        if self.hidden == 0
            || self.heads == 0
            || self.layers == 0
            || self.intermediate == 0
            || self.text_hidden == 0
        {
            return bad(format!("zero dimension in {self:?}"));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(4) {
            return bad(format!(
                "head_dim {} must be a positive multiple of 4 (2-D rope in halves)",
                self.head_dim
            ));
        }
        config::layers_within(self.layers, MAX_LAYERS)?;
        if self.patch == 0 || self.pool == 0 {
            return bad("patch_size and pooling_kernel_size must be positive".into());
        }
        if self.patch > MAX_PATCH_SIZE {
            return bad(format!(
                "patch_size {} exceeds the limit of {MAX_PATCH_SIZE}",
                self.patch
            ));
        }
        Ok(config::positive_eps_theta(
            "eps",
            self.eps,
            self.rope_theta,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(vision: serde_json::Value) -> serde_json::Value {
        let mut v = json!({"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96,
            "num_hidden_layers": 2});
        for (k, x) in vision.as_object().into_iter().flatten() {
            v[k] = x.clone();
        }
        json!({"vision_config": v, "text_config": {"hidden_size": 80}})
    }

    #[test]
    fn small_config_reads() {
        let cfg = GemmaConfig::from_hf(&config(json!({})), 10, false).unwrap();
        assert_eq!((cfg.layers, cfg.patch, cfg.patch_dim()), (2, 16, 768));
    }

    #[test]
    fn huge_layer_counts_and_patch_sizes_are_config_errors() {
        for (k, v) in [
            ("num_hidden_layers", 1_000_000u64),
            ("num_hidden_layers", 1 << 40),
            ("num_hidden_layers", MAX_LAYERS as u64 + 1),
            ("patch_size", 1 << 33),
            ("patch_size", (1 << 32) - 1),
            ("patch_size", MAX_PATCH_SIZE as u64 + 1),
        ] {
            let got = GemmaConfig::from_hf(&config(json!({ k: v })), 10, false);
            assert!(
                matches!(got, Err(GemmaError::Config(_))),
                "{k} = {v}: {got:?}"
            );
        }
        let cfg = config(json!({"num_hidden_layers": MAX_LAYERS, "patch_size": MAX_PATCH_SIZE}));
        let cfg = GemmaConfig::from_hf(&cfg, 10, false).unwrap();
        assert_eq!(cfg.patch_dim(), 3 * MAX_PATCH_SIZE * MAX_PATCH_SIZE);
    }
}
