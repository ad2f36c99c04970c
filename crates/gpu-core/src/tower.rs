//! The contract every family's CUDA tower keeps, so the plumbing around a pass (host
//! preparation off the device's lock, staging, writing rows into a caller's buffer) is written
//! once over all families while each family keeps its own weights, planning and op sequence.

use std::sync::Arc;

use crate::{CudaPrecision, Device, GpuError, GraphStats, GraphStatus, Ran, RowsTarget};

/// How the language model attends over the rows of an image, so an engine can refuse a serving
/// path that cannot honour it. One law per family, stated by its tower crate from the model's
/// text config (`lm_attention`), and reported by the facade's `Model::lm_attention`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LmAttention {
    /// Causal everywhere, image rows included (glm5_next, glm_ocr, step3p7, and gemma4 unless
    /// its text config says otherwise).
    Causal,
    /// gemma4 with `text_config.use_bidirectional_attention = "vision"`: sliding-window layers
    /// attend bidirectionally within one contiguous run of image soft tokens
    /// (`AND(sliding_window, OR(causal, same_block))`; BOI/EOI are not part of the run); full
    /// attention layers stay causal (modeling_gemma4.py, create_masks_for_vision_model).
    BidirectionalImageRunsInSlidingLayers,
    /// The whole text model is non-causal (gemma4 `"all"`; step3p7's
    /// `use_bidirectional_attention = true`, which no release sets).
    Bidirectional,
}

/// A family's tower on a CUDA device: a pass is prepared on the host ([`DeviceTower::prepare_host`],
/// no device needed, so it can run on any thread), staged ([`DeviceTower::stage`]: an
/// asynchronous upload) and run with its rows written into a target
/// ([`DeviceTower::run_into`]).
///
/// **Architecture Invariant:** a family's implementation holds only the family's own laws; the
/// lifecycle around it is written once against this trait.
pub trait DeviceTower: Send {
    /// The family's dimensions and laws (all [`DeviceTower::prepare_host`] needs).
    type Config: Send + Sync;
    /// One image's inputs, borrowed from the caller's tensors.
    type Image<'a>: Sync;
    /// A batch validated and converted on the host, ready to stage.
    type HostBatch: Send;
    /// A batch whose inputs are on (or on their way to) the device.
    type Batch;
    /// The family's error; a device failure converts from [`GpuError`].
    type Error: From<GpuError>;

    /// Validates `images` for a tower of `config` in `precision` and lays their inputs out for
    /// one pass, without a device.
    fn prepare_host(
        config: &Self::Config,
        precision: CudaPrecision,
        images: &[Self::Image<'_>],
    ) -> Result<Self::HostBatch, Self::Error>;

    /// Rows the pass over `batch` gives each of its images, in order.
    fn rows_per_image(batch: &Self::HostBatch) -> Vec<usize>;

    /// Validates `images` and uploads their inputs synchronously (the host half, then a plain
    /// upload: no copy stream, no page-locked slots).
    fn prepare(&self, images: &[Self::Image<'_>]) -> Result<Self::Batch, Self::Error>;

    /// Queues the upload of a host batch (asynchronous; valid until two more are staged).
    fn stage(&mut self, host: Self::HostBatch) -> Result<Self::Batch, Self::Error>;

    /// Runs the pass and writes its rows, image after image in the LM width, into `out`, which
    /// must hold exactly that many elements. Queued on the device's stream.
    fn run_into(&mut self, batch: &Self::Batch, out: RowsTarget<'_>) -> Result<Ran, Self::Error>;

    /// Runs the pass into the tower's workspace (queued, through its graphs where they are on);
    /// its rows come from [`DeviceTower::pass_rows`].
    fn run_pass(&mut self, batch: &Self::Batch) -> Result<(), Self::Error>;

    /// The rows of the last pass over `batch`, per image in the LM width, on the host (waits).
    fn pass_rows(&self, batch: &Self::Batch) -> Result<Vec<Vec<f32>>, Self::Error>;

    /// Turns CUDA graph replay on or off for the passes that follow.
    fn set_graphs(&mut self, on: bool);

    /// Whether graphs replay and, if a capture failed, why not.
    fn graph_status(&self) -> &GraphStatus;

    /// What the graph cache did so far.
    fn graph_stats(&self) -> GraphStats;

    /// The LM width of the rows.
    fn width(&self) -> usize;

    /// The device it runs on.
    fn device(&self) -> &Arc<Device>;
}
