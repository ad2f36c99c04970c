//! A tower's batch, written once for every family: the family's own description of the batch
//! (its meta: tokens, segments, grids or views), the layout a CUDA graph of it is keyed by, the
//! rows each image gives, and its input values on the host ([`HostBatch`], built without a device)
//! or on the device ([`Batch`]). Both read as their meta (`Deref`).

use std::ops::Deref;

use crate::{split_rows, DeviceBuffer, DeviceInputs, GpuError, GraphKey, HostInputs, InputBuffers};

/// How one image's rows come out of a pass's rows (`[rows, width]`, as the projection laid them
/// out): plain `Vec<f32>`s cut at each image's row count, or a family's own split.
pub trait PassRows<M>: Sized {
    /// The rows of each image of `batch`, from `all`, the pass's rows image after image in the
    /// LM width (`width` values a row).
    fn split(batch: &Batch<M>, all: &[f32], width: usize) -> Vec<Self>;
}

impl<M> PassRows<M> for Vec<f32> {
    fn split(batch: &Batch<M>, all: &[f32], width: usize) -> Vec<Self> {
        split_rows(all, batch.rows_per_image(), width)
    }
}

/// The buffers of a family's workspace the pass around the family's op sequence reads.
pub trait PassWorkspace {
    /// The fixed input buffers every forward reads (patch rows, positions, segments).
    fn inputs_mut(&mut self) -> &mut InputBuffers;
    /// The rows the projection writes when no target is given.
    fn rows(&self) -> &DeviceBuffer<f32>;
}

/// What every batch states beside its family's meta.
#[derive(Debug, Clone)]
struct Layout {
    /// The layout a CUDA graph of the batch is keyed by.
    key: GraphKey,
    /// Rows (in the LM width) each image gives, in order.
    rows_per: Vec<usize>,
}

/// A batch of validated images prepared on the host (`DeviceTower::prepare_host`), ready to stage;
/// building one needs no device, so it can run on another thread while the device works.
#[derive(Debug, Clone)]
pub struct HostBatch<M> {
    meta: M,
    layout: Layout,
    inputs: HostInputs,
}

impl<M> HostBatch<M> {
    /// A batch of `meta`, keyed `key` for the CUDA graphs, giving `rows_per[i]` rows to image
    /// `i`, with its input values on the host.
    pub fn new(meta: M, key: GraphKey, rows_per: Vec<usize>, inputs: HostInputs) -> Self {
        HostBatch {
            meta,
            layout: Layout { key, rows_per },
            inputs,
        }
    }

    /// The family's description of the batch.
    pub fn meta(&self) -> &M {
        &self.meta
    }

    /// Its input values.
    pub fn inputs(&self) -> &HostInputs {
        &self.inputs
    }

    /// The layout a CUDA graph of this batch is keyed by.
    pub fn graph_key(&self) -> &GraphKey {
        &self.layout.key
    }

    /// Rows (in the LM width) each image gives, in order.
    pub fn rows_per_image(&self) -> &[usize] {
        &self.layout.rows_per
    }

    /// The device batch, its inputs put on the device by `upload` (plain or staged).
    pub fn upload_with(
        self,
        upload: impl FnOnce(&HostInputs) -> Result<DeviceInputs, GpuError>,
    ) -> Result<Batch<M>, GpuError> {
        Ok(Batch {
            inputs: upload(&self.inputs)?,
            meta: self.meta,
            layout: self.layout,
        })
    }
}

impl<M> Deref for HostBatch<M> {
    type Target = M;
    fn deref(&self) -> &M {
        &self.meta
    }
}

/// A batch of validated images whose inputs are on (or on their way to) the device.
#[derive(Debug)]
pub struct Batch<M> {
    meta: M,
    layout: Layout,
    inputs: DeviceInputs,
}

impl<M> Batch<M> {
    /// The family's description of the batch.
    pub fn meta(&self) -> &M {
        &self.meta
    }

    /// Its inputs on the device.
    pub fn inputs(&self) -> &DeviceInputs {
        &self.inputs
    }

    /// The layout a CUDA graph of this batch is keyed by.
    pub fn graph_key(&self) -> &GraphKey {
        &self.layout.key
    }

    /// Rows (in the LM width) each image gives, in order.
    pub fn rows_per_image(&self) -> &[usize] {
        &self.layout.rows_per
    }

    /// Rows (in the LM width) the pass gives, all images together.
    pub fn rows(&self) -> usize {
        self.layout.rows_per.iter().sum()
    }
}

impl<M> Deref for Batch<M> {
    type Target = M;
    fn deref(&self) -> &M {
        &self.meta
    }
}
