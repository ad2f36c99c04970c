//! tower-gemma: the Gemma-4 vision encoder and its multimodal embedder (transformers 5.23
//! `Gemma4VisionModel` + `Gemma4MultimodalEmbedder`), loaded from a llama.cpp mmproj GGUF or an
//! HF checkpoint, giving the rows that replace the `<|image|>` soft tokens in the LM.
#![deny(missing_docs)]

mod config;
pub mod cuda;
mod error;
mod forward;
mod weights;

pub use config::{GemmaConfig, GgufActivation, MAX_LAYERS, MAX_PATCH_SIZE};
pub use cuda::{CudaError, CudaPrecision, GemmaBatch, GemmaCuda, GemmaHostBatch};
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
        precision: CudaPrecision,
    ) -> std::result::Result<GemmaCuda, CudaError> {
        GemmaCuda::new(dev, &self.config, &self.weights, precision)
    }

    /// Runs the host reference on `images` and returns each image's rows `[n, text_hidden]`.
    pub fn encode_host(&self, images: &[GemmaImage<'_>]) -> Result<Vec<Vec<f32>>> {
        Ok(forward_host(&self.config, &self.weights, images, false)?.0)
    }
}
