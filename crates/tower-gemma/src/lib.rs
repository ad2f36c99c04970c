//! tower-gemma: the Gemma-4 vision encoder and its multimodal embedder (transformers 5.23
//! `Gemma4VisionModel` + `Gemma4MultimodalEmbedder`), loaded from a llama.cpp mmproj GGUF or an
//! HF checkpoint, giving the rows that replace the `<|image|>` soft tokens in the LM.
#![deny(missing_docs)]

mod config;
pub mod cuda;
mod error;
mod forward;
mod weights;

/// How the LM attends over the image rows (one type for every family, from gpu-core).
pub use tower_core::LmAttention;

/// The LM attention law a gemma4 `config.json` states in
/// `text_config.use_bidirectional_attention` (transformers 5.23): `"vision"` makes image runs
/// bidirectional in the sliding-window layers, `"all"` the whole text model; anything else, or
/// no config (an mmproj GGUF carries no text config), is causal.
pub fn lm_attention(config: Option<&serde_json::Value>) -> LmAttention {
    let flag = config
        .and_then(|c| c.get("text_config"))
        .and_then(|t| t.get("use_bidirectional_attention"));
    match flag {
        Some(serde_json::Value::String(s)) if s == "vision" => {
            LmAttention::BidirectionalImageRunsInSlidingLayers
        }
        Some(serde_json::Value::String(s)) if s == "all" => LmAttention::Bidirectional,
        _ => LmAttention::Causal,
    }
}

pub use config::{GemmaConfig, GgufActivation, MAX_LAYERS, MAX_PATCH_SIZE};
pub use cuda::{CudaError, GemmaBatch, GemmaCuda, GemmaHostBatch, GemmaMeta, Precision};
pub use error::{GemmaError, Result};
pub use forward::{forward_host, GemmaImage, GemmaStages, ATTENTION_SCALE};
pub use weights::{
    load_gguf, load_gguf_mapped, load_hf, load_hf_mapped, GemmaWeights, Layer, Linear,
};

/// A loaded Gemma-4 vision tower (host weights; [`GemmaTower::to_cuda`] puts them on a device).
#[derive(Debug, Clone)]
pub struct GemmaTower {
    /// Dimensions and laws.
    pub config: GemmaConfig,
    /// Weights in f32, exactly the file's values.
    pub weights: GemmaWeights,
}

impl GemmaTower {
    /// Loads from an opened HF checkpoint.
    pub fn from_checkpoint(ck: &st_reader::Checkpoint) -> Result<GemmaTower> {
        let (config, weights) = load_hf(ck)?;
        Ok(GemmaTower { config, weights })
    }

    /// Loads from an opened mmproj GGUF; `activation` picks the MLP activation the file omits.
    pub fn from_gguf(g: &gguf_reader::GgufFile, activation: GgufActivation) -> Result<GemmaTower> {
        let (config, weights) = load_gguf(g, activation)?;
        Ok(GemmaTower { config, weights })
    }

    /// Uploads the weights to `dev` once, in `precision` (see [`cuda`]).
    pub fn to_cuda(
        &self,
        dev: std::sync::Arc<gpu_core::Device>,
        precision: Precision,
    ) -> std::result::Result<GemmaCuda, CudaError> {
        GemmaCuda::new(dev, &self.config, &self.weights, precision)
    }

    /// Runs the host reference on `images` and returns each image's rows `[n, text_hidden]`.
    pub fn encode_host(&self, images: &[GemmaImage<'_>]) -> Result<Vec<Vec<f32>>> {
        Ok(forward_host(&self.config, &self.weights, images, false)?.0)
    }
}

impl tower_core::HostTower for GemmaTower {
    type Image<'a> = GemmaImage<'a>;
    type Error = GemmaError;

    fn encode_rows(&self, images: &[GemmaImage<'_>]) -> Result<Vec<Vec<f32>>> {
        self.encode_host(images)
    }

    fn width(&self) -> usize {
        self.config.text_hidden
    }
}
