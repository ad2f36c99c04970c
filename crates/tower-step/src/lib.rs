//! tower-step: the Step-3.7 vision encoder and its projector (transformers 5.23
//! `Step3p7VisionModel` + `Step3p7Model.multi_modal_projector`), loaded from a vendor-layout
//! checkpoint (what releases ship and `save_pretrained` writes; NVFP4 releases included, their
//! packed LM tensors ignored) or an HF-layout one, giving the rows that replace the `<im_patch>`
//! tokens in the LM: per image every crop tile's rows, then the global view's.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ck = st_reader::Checkpoint::open("fixtures/models/step3p7")?;
//! let tower = tower_step::StepTower::from_checkpoint(&ck)?;
//! let global = vec![0.0f32; 3 * 168 * 168];
//! let image = tower_step::StepImage {
//!     crops: vec![],
//!     global: tower_step::StepView { pixels: &global, height: 168, width: 168 },
//!     newline_mask: vec![],
//! };
//! let rows = tower.encode_host(&[image])?;
//! assert_eq!(rows[0].rows.len(), rows[0].global_rows * tower.config.text_hidden);
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod config;
pub mod cuda;
mod error;
mod forward;
mod weights;

pub use config::{StepConfig, MAX_IMAGE_SIZE, MAX_LAYERS, MAX_PATCH_SIZE};
pub use cuda::{CudaError, Precision, StepBatch, StepCuda, StepHostBatch, StepMeta};
pub use error::{Result, StepError};
pub use forward::{
    attention_scale, forward_host, StepImage, StepProcessorOutput, StepRows, StepStages, StepView,
    ViewStages,
};
pub use weights::{
    load, load_mapped, Layer, StepWeights, WeightLayout, HF_PROJECTOR_PREFIXES,
    VENDOR_PROJECTOR_PREFIXES, VISION_PREFIXES,
};

/// How the LM attends over the image rows (one type for every family, from gpu-core).
pub use tower_core::LmAttention;

/// The former name of [`LmAttention`].
#[deprecated(note = "one type for every family: use `LmAttention`")]
pub type LmAttentionLaw = LmAttention;

/// The LM attention law a step3p7 `config.json` states: causal, image tokens included
/// (`Step3p7TextConfig.use_bidirectional_attention = False`, configuration_step3p7.py:170;
/// modeling_step3p7.py:885-892 builds `create_causal_mask`), bidirectional over the whole prompt
/// only where `text_config.use_bidirectional_attention` is `true` (no release sets it).
pub fn lm_attention(config: Option<&serde_json::Value>) -> LmAttention {
    let flag = config
        .and_then(|c| c.get("text_config"))
        .and_then(|t| t.get("use_bidirectional_attention"));
    match flag {
        Some(serde_json::Value::Bool(true)) => LmAttention::Bidirectional,
        _ => LmAttention::Causal,
    }
}

/// A loaded Step-3.7 vision tower (host weights; [`StepTower::to_cuda`] puts them on a device).
#[derive(Debug, Clone)]
pub struct StepTower {
    /// Dimensions and laws.
    pub config: StepConfig,
    /// Weights in f32, exactly the file's values.
    pub weights: StepWeights,
}

impl StepTower {
    /// Loads from an opened checkpoint (vendor or HF layout) and its `config.json`.
    pub fn from_checkpoint(ck: &st_reader::Checkpoint) -> Result<StepTower> {
        let config = ck
            .config()
            .ok_or_else(|| StepError::Config("the checkpoint has no config.json".into()))?;
        Self::from_checkpoint_with_config(ck, config)
    }

    /// Loads from an opened checkpoint with a `config.json` value given apart (for in-memory
    /// checkpoints, which have no directory).
    pub fn from_checkpoint_with_config(
        ck: &st_reader::Checkpoint,
        config: &serde_json::Value,
    ) -> Result<StepTower> {
        let (config, weights) = load(ck, config)?;
        Ok(StepTower { config, weights })
    }

    /// The dimensions and laws.
    pub fn config(&self) -> &StepConfig {
        &self.config
    }

    /// Uploads the weights to `dev` once, in `precision` (see [`cuda`]).
    pub fn to_cuda(
        &self,
        dev: std::sync::Arc<cuda::Device>,
        precision: Precision,
    ) -> std::result::Result<StepCuda, CudaError> {
        StepCuda::new(dev, &self.config, &self.weights, precision)
    }

    /// The LM's attention law over the image rows (see [`lm_attention`]).
    pub fn lm_attention(&self) -> LmAttention {
        if self.config.lm_bidirectional {
            LmAttention::Bidirectional
        } else {
            LmAttention::Causal
        }
    }

    /// Runs the host reference on `images` and returns each image's rows `[n, text_hidden]`
    /// (crops first, then the global view) with its newline mask.
    pub fn encode_host(&self, images: &[StepImage<'_>]) -> Result<Vec<StepRows>> {
        Ok(forward_host(&self.config, &self.weights, images, false)?.0)
    }

    /// Like [`StepTower::encode_host`], also returning the stage activations when `keep_stages`.
    pub fn forward_host(
        &self,
        images: &[StepImage<'_>],
        keep_stages: bool,
    ) -> Result<(Vec<StepRows>, Option<StepStages>)> {
        forward_host(&self.config, &self.weights, images, keep_stages)
    }
}

impl tower_core::HostTower for StepTower {
    type Image<'a> = StepImage<'a>;
    type Error = StepError;

    fn encode_rows(&self, images: &[StepImage<'_>]) -> Result<Vec<Vec<f32>>> {
        Ok(self
            .encode_host(images)?
            .into_iter()
            .map(Vec::from)
            .collect())
    }

    fn width(&self) -> usize {
        self.config.text_hidden
    }
}
