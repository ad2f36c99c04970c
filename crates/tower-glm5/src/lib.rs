//! tower-glm5: the GLM vision towers — transformers 5.23 `Glm5NextVisionModel` (glm5_next)
//! and `GlmOcrVisionModel` (glm_ocr) — loaded from an HF checkpoint, giving the merger rows
//! that replace the image tokens in the LM.
//!
//! The two families are one program; the config states their differences (see [`GlmConfig`]):
//! the SwiGLU clamp limit (glm5_next `swiglu_limit`, glm_ocr none) and the merger's inner
//! width (glm5_next `projection_intermediate_size`, glm_ocr `out_hidden_size · in_channels`).
#![deny(missing_docs)]

mod config;
pub mod cuda;
mod error;
mod forward;
mod weights;

pub use config::{
    GlmConfig, GlmFamily, DEFAULT_PROJECTION_INTERMEDIATE_SIZE, DEFAULT_RMS_NORM_EPS,
    DEFAULT_ROPE_THETA, DEFAULT_SWIGLU_LIMIT, MAX_DIMENSION, MAX_LAYERS, MERGER_LAYER_NORM_EPS,
};
pub use cuda::{CudaError, GlmBatch, GlmCuda, GlmHostBatch, GlmMeta, Precision};
pub use error::{GlmError, Result};
pub use forward::{
    attention_scale, forward_host, split_images, vision_cu_seqlens, vision_positions, GlmImage,
    GlmStages,
};
pub use weights::{
    load_hf, load_hf_mapped, load_hf_with_config, Block, GlmWeights, Linear, PROBE_TENSOR,
};

/// How the LM attends over the image rows (one type for every family, from gpu-core).
pub use tower_core::LmAttention;

/// The LM attention law of a glm5_next or glm_ocr model, whatever its `config.json` says:
/// causal (see [`GlmTower::lm_attention`]).
pub fn lm_attention(_config: Option<&serde_json::Value>) -> LmAttention {
    LmAttention::Causal
}

/// A loaded GLM vision tower (host weights; [`GlmTower::to_cuda`] puts them on a device).
#[derive(Debug, Clone)]
pub struct GlmTower {
    /// Dimensions and laws.
    pub config: GlmConfig,
    /// Weights in f32, exactly the file's values.
    pub weights: GlmWeights,
}

/// The former name of [`GlmTower`] (the crate's types are `Glm*`: `GlmConfig`, `GlmCuda`, …).
#[deprecated(note = "renamed `GlmTower`, beside `GlmCuda`")]
pub type Glm5Tower = GlmTower;

impl GlmTower {
    /// Loads from an opened HF checkpoint (`model.visual.*` + `config.json`).
    pub fn from_checkpoint(ck: &st_reader::Checkpoint) -> Result<GlmTower> {
        let (config, weights) = load_hf(ck)?;
        Ok(GlmTower { config, weights })
    }

    /// Dimensions and laws.
    pub fn config(&self) -> &GlmConfig {
        &self.config
    }

    /// Uploads the weights to `dev` in `precision` (see [`cuda`]).
    pub fn to_cuda(
        &self,
        dev: std::sync::Arc<cuda::Device>,
        precision: Precision,
    ) -> std::result::Result<GlmCuda, CudaError> {
        GlmCuda::new(dev, &self.config, &self.weights, precision)
    }

    /// Runs the host reference on `images` and returns each image's rows `[t·h·w/4, text_hidden]`.
    pub fn encode_host(&self, images: &[GlmImage<'_>]) -> Result<Vec<Vec<f32>>> {
        Ok(forward_host(&self.config, &self.weights, images, false)?.0)
    }

    /// Runs the host reference and also returns the stage activations when `keep_stages`.
    pub fn forward_host(
        &self,
        images: &[GlmImage<'_>],
        keep_stages: bool,
    ) -> Result<(Vec<Vec<f32>>, Option<GlmStages>)> {
        forward_host(&self.config, &self.weights, images, keep_stages)
    }

    /// The LM's attention over image tokens: causal for both families.
    ///
    /// glm5_next's LM is causal (KDA linear attention + DSA indexer over a 2-D padding mask,
    /// `Glm5NextModel.create_masks_for_generate`, modeling_glm5_next.py:2354-2375; no
    /// bidirectional image islands). glm_ocr's LM builds `create_causal_mask`
    /// (modeling_glm_ocr.py:771; `GlmOcrTextAttention.is_causal = True`, :183) and places image
    /// tokens with 3-D mRoPE positions only.
    pub fn lm_attention(&self) -> LmAttention {
        match self.config.family {
            GlmFamily::Glm5Next | GlmFamily::GlmOcr => LmAttention::Causal,
        }
    }
}

impl tower_core::HostTower for GlmTower {
    type Image<'a> = GlmImage<'a>;
    type Error = GlmError;

    fn encode_rows(&self, images: &[GlmImage<'_>]) -> Result<Vec<Vec<f32>>> {
        self.encode_host(images)
    }

    fn width(&self) -> usize {
        self.config.text_hidden
    }
}
