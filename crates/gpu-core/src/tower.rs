//! The contract every family's CUDA tower keeps, so the plumbing around a pass (host
//! preparation off the device's lock, staging, writing rows into a caller's buffer) is written
//! once over all families while each family keeps its own weights, planning and op sequence.

use std::sync::Arc;

use crate::{
    Batch, CudaError, Device, DeviceBuffer, GraphKey, GraphStats, GraphStatus, HostBatch, HostCopy,
    PassRows, PassRunner, PassWorkspace, Precision, Ran, RowsTarget, TowerBase,
};

/// Short for the result of a [`DeviceTower`] `D`'s calls: gpu-core's one [`CudaError`] over the
/// family's own error.
pub type TowerResult<T, D> = std::result::Result<T, CudaError<<D as DeviceTower>::Family>>;

/// A family's tower on a CUDA device: a pass is prepared on the host ([`DeviceTower::prepare_host`],
/// no device needed, so it can run on any thread), staged ([`DeviceTower::stage`]: an
/// asynchronous upload) and run with its rows written into a target
/// ([`DeviceTower::run_into`]) or into the tower's workspace ([`DeviceTower::run`], then
/// [`DeviceTower::rows`]).
///
/// A family states only what is its own (the required items): its host-side planning and
/// validation ([`DeviceTower::prepare_host`]), how big its workspace must be for a batch
/// ([`DeviceTower::grow`]), its op sequence ([`DeviceTower::forward`]) and projection
/// ([`DeviceTower::project`]), its stages, and where its [`TowerBase`] is. The lifecycle around
/// them (the batch, staging, the workspace taken out of the [`PassRunner`] for a pass and put
/// back, the CUDA graphs of the encoder, downloading and splitting the rows) is written once
/// here, as the provided methods.
///
/// **Architecture Invariant:** a family's implementation holds only the family's own laws; the
/// lifecycle around it is written once against this trait.
pub trait DeviceTower: Send {
    /// The family's dimensions and laws (all [`DeviceTower::prepare_host`] needs).
    type Config: Send + Sync;
    /// One image's inputs, borrowed from the caller's tensors.
    type Image<'a>: Sync;
    /// What a batch is apart from its input values, graph key and rows (tokens, segments, grids
    /// or views): the meta of its [`HostBatch`] and [`Batch`].
    type Meta: Send;
    /// The family's own error (the weights or the input are wrong), inside [`CudaError`].
    type Family: std::error::Error + Send + Sync + 'static;
    /// The device buffers of a pass (the family's layout), kept in the tower's [`PassRunner`].
    type Workspace: PassWorkspace;
    /// The activations the encoder downloads along the way when asked ([`DeviceTower::forward`]).
    type EncoderStages;
    /// The activations a pass downloads when asked ([`DeviceTower::run`]): the encoder's with
    /// the rows ([`DeviceTower::with_rows`]).
    type Stages;
    /// One image's rows as [`DeviceTower::rows`] gives them back.
    type Rows: PassRows<Self::Meta> + Into<Vec<f32>>;

    /// Validates `images` for a tower of `config` in `precision` and lays their inputs out for
    /// one pass, without a device.
    fn prepare_host(
        config: &Self::Config,
        precision: Precision,
        images: &[Self::Image<'_>],
    ) -> TowerResult<HostBatch<Self::Meta>, Self>;

    /// Makes the workspace big enough for `batch` (with the buffers stages need when `keep`),
    /// and whatever else the family keeps per batch layout; through [`PassRunner::regrow`].
    fn grow(&mut self, batch: &Batch<Self::Meta>, keep: bool) -> TowerResult<(), Self>;

    /// The family's encoder on `ws`, whose input buffers hold `batch`'s: everything up to the
    /// projection to the LM width; with `keep` the stages are downloaded along the way.
    fn forward(
        &self,
        ws: &mut Self::Workspace,
        batch: &Batch<Self::Meta>,
        keep: bool,
    ) -> TowerResult<Option<Self::EncoderStages>, Self>;

    /// The projection to the LM width after [`DeviceTower::forward`], into `out` (the
    /// workspace's rows when `None`); outside any graph, since `out` changes from call to call.
    fn project(
        &self,
        ws: &mut Self::Workspace,
        batch: &Batch<Self::Meta>,
        out: Option<RowsTarget<'_>>,
    ) -> TowerResult<(), Self>;

    /// The stages of a pass: the encoder's, with its rows (`[rows, width]`, as the projection
    /// laid them out).
    fn with_rows(
        &self,
        stages: Self::EncoderStages,
        batch: &Batch<Self::Meta>,
        rows: Vec<f32>,
    ) -> Self::Stages;

    /// Bytes of the model's tensors on the device (without the workspace and helper buffers).
    fn weight_bytes(&self) -> usize;

    /// What every tower holds beside its weights.
    fn base(&self) -> &TowerBase<Self::Config, Self::Workspace>;

    /// What every tower holds beside its weights, to change.
    fn base_mut(&mut self) -> &mut TowerBase<Self::Config, Self::Workspace>;

    /// Rows the pass over `batch` gives each of its images, in order.
    fn rows_per_image(batch: &HostBatch<Self::Meta>) -> Vec<usize> {
        batch.rows_per_image().to_vec()
    }

    /// Rows (in the LM width) the pass over `batch` gives, all images together.
    fn batch_rows(batch: &Batch<Self::Meta>) -> usize {
        batch.rows()
    }

    /// The family's error for a call the tower cannot serve (a wrong target, no workspace yet).
    fn unsupported(what: String) -> CudaError<Self::Family> {
        CudaError::Unsupported(what)
    }

    /// Dimensions and laws.
    fn config(&self) -> &Self::Config {
        &self.base().cfg
    }

    /// The LM width of the rows.
    fn width(&self) -> usize {
        self.base().width
    }

    /// The precision the weights were uploaded in.
    fn precision(&self) -> Precision {
        self.base().precision
    }

    /// The device it runs on.
    fn device(&self) -> &Arc<Device> {
        &self.base().dev
    }

    /// Graphs, uploader and workspace of the tower.
    fn passes(&self) -> &PassRunner<Self::Workspace> {
        &self.base().passes
    }

    /// Graphs, uploader and workspace of the tower, to change.
    fn passes_mut(&mut self) -> &mut PassRunner<Self::Workspace> {
        &mut self.base_mut().passes
    }

    /// The pass on `ws` (taken out of the runner, grown for `batch`): the batch's inputs loaded
    /// into the workspace's fixed buffers, the encoder (through [`DeviceTower::encoder`]), then
    /// the projection into `out`; with `keep` the stages come back too, with the rows.
    fn pass(
        &mut self,
        ws: &mut Self::Workspace,
        batch: &Batch<Self::Meta>,
        keep: bool,
        out: Option<RowsTarget<'_>>,
    ) -> TowerResult<(Option<Self::Stages>, Ran), Self> {
        self.passes()
            .load_inputs(self.device(), batch.inputs(), ws.inputs_mut())?;
        let key = batch.graph_key();
        let (stages, ran) =
            self.encoder(ws, key, keep, |t, ws, keep| t.forward(ws, batch, keep))?;
        self.project(ws, batch, out)?;
        let Some(stages) = stages else {
            return Ok((None, ran));
        };
        let rows = self
            .device()
            .download_prefix(ws.rows(), batch.rows() * self.width())?;
        self.refuse_non_finite(crate::all_finite(&rows))?;
        Ok((Some(self.with_rows(stages, batch, rows)), ran))
    }

    /// Downloads the rows of the last pass over `batch` from the workspace, per image (waits).
    fn rows(&self, batch: &Batch<Self::Meta>) -> TowerResult<Vec<Self::Rows>, Self> {
        let all = self.download_rows(batch.rows(), |ws| ws.rows())?;
        self.rows_of(batch, &all)
    }

    /// The rows of a pass over `batch` per image, from `all`, all of its rows read back (image
    /// after image in the LM width); in f16 an error when any is not finite
    /// ([`DeviceTower::refuse_non_finite`]).
    fn rows_of(
        &self,
        batch: &Batch<Self::Meta>,
        all: &[f32],
    ) -> TowerResult<Vec<Self::Rows>, Self> {
        match self.precision() {
            Precision::F16 => self.refuse_non_finite(crate::all_finite(all))?,
            Precision::Bf16 | Precision::F32 => {}
        }
        Ok(Self::Rows::split(batch, all, self.width()))
    }

    /// In f16, an error when the rows are not all finite (`finite` false): f16 holds magnitudes
    /// up to 65504 only, and a model whose activations leave that range gives NaN or ±∞ rows,
    /// which are refused, never handed out (issue 39: never ship wrong rows). bf16 and f32 rows
    /// are handed out as computed (bf16 has f32's range).
    fn refuse_non_finite(&self, finite: bool) -> TowerResult<(), Self> {
        match self.precision() {
            Precision::F16 if !finite => Err(Self::unsupported(
                "f16 rows are not finite (NaN or ±inf): this model's activations leave f16's \
                 range (±65504) on this input; use bf16 (compute capability 8.0+) or f32"
                    .into(),
            )),
            Precision::F16 | Precision::Bf16 | Precision::F32 => Ok(()),
        }
    }

    /// Validates `images` and uploads their inputs synchronously (the host half, then a plain
    /// upload: no copy stream, no page-locked slots).
    fn prepare(&self, images: &[Self::Image<'_>]) -> TowerResult<Batch<Self::Meta>, Self> {
        let host = Self::prepare_host(self.config(), self.precision(), images)?;
        Ok(host.upload_with(|inputs| self.device().upload_inputs(inputs))?)
    }

    /// Queues the upload of a host batch from page-locked memory on a copy stream of its own and
    /// returns at once: the copy overlaps whatever the device is running. The batch stays valid
    /// until two more are staged ([`crate::UPLOAD_SLOTS`]). `copy` says which threads copy the
    /// batch into the page-locked memory: [`HostCopy::OneThread`] in a stream of passes,
    /// [`HostCopy::Spread`] for one request whose preparation is done.
    fn stage(
        &mut self,
        host: HostBatch<Self::Meta>,
        copy: HostCopy,
    ) -> TowerResult<Batch<Self::Meta>, Self> {
        let (dev, precision) = (self.device().clone(), self.precision());
        Ok(host.upload_with(|inputs| self.passes_mut().stage(&dev, precision, inputs, copy))?)
    }

    /// Runs the whole forward on `batch`; the rows stay on the device ([`DeviceTower::rows`]).
    /// With `keep_stages` the stage activations are downloaded as they are produced.
    ///
    /// The inputs are first copied into fixed device buffers (a staged batch's after its upload
    /// finished, on the device); then in bf16 or f16 mode without stages the encoder goes through the
    /// CUDA graph cache ([`crate::Graphs`]: eager the first time a layout is seen, captured the
    /// second, replayed after), else it runs eagerly ([`DeviceTower::encoder`]).
    fn run(
        &mut self,
        batch: &Batch<Self::Meta>,
        keep_stages: bool,
    ) -> TowerResult<Option<Self::Stages>, Self> {
        self.run_graphed(batch, keep_stages).map(|(s, _)| s)
    }

    /// [`DeviceTower::run`], also saying how the encoder ran.
    fn run_graphed(
        &mut self,
        batch: &Batch<Self::Meta>,
        keep_stages: bool,
    ) -> TowerResult<(Option<Self::Stages>, Ran), Self> {
        self.with_workspace(batch, keep_stages, |t, ws| {
            t.pass(ws, batch, keep_stages, None)
        })
    }

    /// Runs the pass and writes its rows, image after image in the LM width, into `out`, which
    /// must hold exactly that many elements: the projection writes there directly, after the
    /// (graphed) encoder. Queued on the device's stream; returns how the encoder ran. In f16 the
    /// rows are then read back and checked finite ([`Device::rows_finite`]: a download and a
    /// wait, f16's price for never handing out overflowed rows).
    fn run_into(
        &mut self,
        batch: &Batch<Self::Meta>,
        mut out: RowsTarget<'_>,
    ) -> TowerResult<Ran, Self> {
        let ran = self.launch_into(batch, out.reborrow())?;
        match self.precision() {
            Precision::F16 => self.refuse_non_finite(self.device().rows_finite(&out)?)?,
            Precision::Bf16 | Precision::F32 => {}
        }
        Ok(ran)
    }

    /// [`DeviceTower::run_into`] without f16's finiteness check: queued, never waits. Whoever
    /// reads the rows back checks them ([`DeviceTower::rows_of`] does), as a queue of passes
    /// whose rows are read while the next pass runs must ([`crate::PassQueue`]).
    fn launch_into(
        &mut self,
        batch: &Batch<Self::Meta>,
        mut out: RowsTarget<'_>,
    ) -> TowerResult<Ran, Self> {
        let rows = Self::batch_rows(batch);
        if out.len() != rows * self.width() {
            return Err(Self::unsupported(format!(
                "a rows target of {} elements for {} rows of {}",
                out.len(),
                rows,
                self.width()
            )));
        }
        let (_, ran) = self.with_workspace(batch, false, |t, ws| {
            t.pass(ws, batch, false, Some(out.reborrow()))
        })?;
        Ok(ran)
    }

    /// Runs the pass into the tower's workspace (queued, through its graphs where they are on);
    /// its rows come from [`DeviceTower::pass_rows`].
    fn run_pass(&mut self, batch: &Batch<Self::Meta>) -> TowerResult<(), Self> {
        self.run(batch, false).map(|_| ())
    }

    /// The rows of the last pass over `batch`, per image in the LM width, on the host (waits).
    fn pass_rows(&self, batch: &Batch<Self::Meta>) -> TowerResult<Vec<Vec<f32>>, Self> {
        Ok(self.rows(batch)?.into_iter().map(Into::into).collect())
    }

    /// [`DeviceTower::prepare`], [`DeviceTower::run`] and [`DeviceTower::rows`] in one call.
    #[allow(clippy::type_complexity)]
    fn encode(
        &mut self,
        images: &[Self::Image<'_>],
        keep_stages: bool,
    ) -> TowerResult<(Vec<Self::Rows>, Option<Self::Stages>), Self> {
        let batch = self.prepare(images)?;
        let stages = self.run(&batch, keep_stages)?;
        Ok((self.rows(&batch)?, stages))
    }

    /// Turns CUDA graphs of the bf16 and f16 encoder on (the default) or off (every forward eager).
    fn set_graphs(&mut self, on: bool) {
        self.passes_mut().set_graphs(on);
    }

    /// Whether CUDA graphs are used and, if a capture failed, why not.
    fn graph_status(&self) -> &GraphStatus {
        self.passes().graph_status()
    }

    /// What the graph cache did so far (captures, replays, eager forwards).
    fn graph_stats(&self) -> GraphStats {
        self.passes().graph_stats()
    }

    /// Calls `f` with the workspace, grown for `batch` first ([`DeviceTower::grow`]) and taken
    /// out of the runner for the call (so `f` may borrow the whole tower), then put back.
    fn with_workspace<R>(
        &mut self,
        batch: &Batch<Self::Meta>,
        keep: bool,
        f: impl FnOnce(&mut Self, &mut Self::Workspace) -> TowerResult<R, Self>,
    ) -> TowerResult<R, Self> {
        self.grow(batch, keep)?;
        let mut ws = self
            .passes_mut()
            .take_workspace()
            .ok_or_else(|| Self::unsupported("workspace missing after allocation".into()))?;
        let r = f(self, &mut ws);
        self.passes_mut().put_workspace(ws);
        r
    }

    /// The encoder of a pass on `ws`, with the batch's inputs already loaded: `forward(tower,
    /// ws, keep)` eagerly when `keep` (stages are downloaded along the way) or in f32 mode, else
    /// (bf16, f16)
    /// through the CUDA graph cache under `key` (without stages). Returns the stages and how it
    /// ran.
    fn encoder<S>(
        &mut self,
        ws: &mut Self::Workspace,
        key: &GraphKey,
        keep: bool,
        mut forward: impl FnMut(&Self, &mut Self::Workspace, bool) -> TowerResult<Option<S>, Self>,
    ) -> TowerResult<(Option<S>, Ran), Self> {
        let graphed = match self.precision() {
            Precision::Bf16 | Precision::F16 => true,
            Precision::F32 => false,
        };
        if keep || !graphed {
            return Ok((forward(self, ws, keep)?, Ran::Eager));
        }
        let mut graphs = self.passes_mut().take_graphs();
        let dev = self.device().clone();
        let this: &Self = self;
        let r = graphs.run(&*dev, key, || forward(this, ws, false).map(|_| ()));
        self.passes_mut().put_graphs(graphs);
        Ok((None, r?))
    }

    /// Downloads the first `rows` rows (in the LM width) of the workspace's buffer `buf` (waits);
    /// an error before any pass allocated a workspace.
    fn download_rows(
        &self,
        rows: usize,
        buf: impl FnOnce(&Self::Workspace) -> &DeviceBuffer<f32>,
    ) -> TowerResult<Vec<f32>, Self> {
        let ws = self
            .passes()
            .workspace()
            .ok_or_else(|| Self::unsupported("rows() before run()".into()))?;
        Ok(self
            .device()
            .download_prefix(buf(ws), rows * self.width())?)
    }
}
