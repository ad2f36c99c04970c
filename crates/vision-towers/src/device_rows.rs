//! Rows that stay on the GPU: one device buffer per request in the LM's dtype, per-image row
//! offsets, and the ordering contract with the caller's stream (see [`gpu_core::OwnedRows`]).

use std::ops::Range;
use std::sync::{Mutex, PoisonError};

use gpu_core::{OwnedRows, RowsDtype, RowsTarget};

use crate::cuda_engine::CudaFamily;
use crate::inputs::{pass_ranges, Images};
use crate::tower::Tower;
use crate::tower_error::{cuda_err, InputError};
use crate::{Precision, TowerError};

/// One request's rows on a CUDA device: `[rows, width]` row-major in one buffer, image after
/// image in request order, in the dtype asked for. The rows are written on the tower's stream;
/// make a stream wait for them with [`DeviceRows::wait_on_stream`] or block with
/// [`DeviceRows::synchronize`] before reading them. The memory is freed when this is dropped,
/// after the tower's writes and after the work already queued on every stream made to wait.
/// `Send + Sync`.
#[derive(Debug)]
pub struct DeviceRows {
    owned: OwnedRows,
    /// Row offsets, `images + 1` entries from 0 to the total.
    offsets: Vec<usize>,
    width: usize,
}

impl DeviceRows {
    /// The element type.
    pub fn dtype(&self) -> RowsDtype {
        self.owned.dtype()
    }

    /// The LM width (columns).
    pub fn width(&self) -> usize {
        self.width
    }

    /// Rows of all images together.
    pub fn rows(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }

    /// Images in the request.
    pub fn images(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Row offsets: image `i` holds rows `offsets[i]..offsets[i + 1]`.
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// The rows of image `i`, `None` past the last image.
    pub fn image_rows(&self, i: usize) -> Option<Range<usize>> {
        Some(*self.offsets.get(i)?..*self.offsets.get(i + 1)?)
    }

    /// The CUDA device ordinal the rows live on.
    pub fn ordinal(&self) -> usize {
        self.owned.ordinal()
    }

    /// The device address of the first row (a `CUdeviceptr` in the device's primary context,
    /// valid in PyTorch and the CUDA runtime while this value lives).
    pub fn device_ptr(&self) -> u64 {
        self.owned.addr()
    }

    /// The device address of image `i`'s first row, `None` past the last image.
    pub fn image_ptr(&self, i: usize) -> Option<u64> {
        let start = *self.offsets.get(i)?;
        Some(self.owned.addr() + (start * self.width * self.dtype().size()) as u64)
    }

    /// Makes `stream` wait on the device (the host is not blocked) until the rows are written,
    /// and orders the free of this memory after that stream's work queued before the drop.
    /// `0` is the legacy default stream, [`gpu_core::PER_THREAD_DEFAULT_STREAM`] the calling
    /// thread's per-thread default stream.
    ///
    /// # Safety
    /// `stream` must be a live `CUstream` of this device's primary context and stay alive until
    /// these rows are dropped.
    pub unsafe fn wait_on_stream(&self, stream: u64) -> Result<(), TowerError> {
        // SAFETY: the caller's contract.
        unsafe { self.owned.wait_on_stream(stream) }.map_err(device_err)
    }

    /// Blocks the calling thread until the rows are written.
    pub fn synchronize(&self) -> Result<(), TowerError> {
        self.owned.synchronize().map_err(device_err)
    }

    /// The rows copied to the host as f32 (bf16 widened exactly); blocks until written.
    pub fn to_host_f32(&self) -> Result<Vec<f32>, TowerError> {
        self.owned.download_f32().map_err(device_err)
    }

    /// The rows' bytes copied to the host (little-endian, the dtype's layout); blocks until
    /// written.
    pub fn to_host_bytes(&self) -> Result<Vec<u8>, TowerError> {
        self.owned.download_bytes().map_err(device_err)
    }
}

fn device_err(e: gpu_core::GpuError) -> TowerError {
    TowerError::Gpu {
        path: "<device rows>".into(),
        source: Box::new(e),
    }
}

/// A caller's device memory to receive the rows of a request, and the caller's stream: the
/// tower writes after the work the stream has queued, and the stream waits for the rows.
#[derive(Debug, Clone, Copy)]
pub struct DeviceOut {
    addr: u64,
    len: usize,
    dtype: RowsDtype,
    ordinal: usize,
    stream: u64,
}

impl DeviceOut {
    /// `len` elements of `dtype` at device address `addr` on CUDA device `ordinal`, ordered with
    /// `stream` (a `CUstream`; `0` = the legacy default stream,
    /// [`gpu_core::PER_THREAD_DEFAULT_STREAM`] = the calling thread's per-thread default stream).
    /// The rows go to the start of the memory, image after image; `len` must cover them.
    ///
    /// # Safety
    /// `addr .. addr + len·size` must be device memory of that device's primary context
    /// (`cudaMalloc`, `cuMemAlloc`, a PyTorch tensor), valid and not used by anything else until
    /// the write completes in `stream`'s order; `stream` must be a live stream of that context.
    pub unsafe fn new(
        addr: u64,
        len: usize,
        dtype: RowsDtype,
        ordinal: usize,
        stream: u64,
    ) -> DeviceOut {
        DeviceOut {
            addr,
            len,
            dtype,
            ordinal,
            stream,
        }
    }

    /// Elements it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its element type.
    pub fn dtype(&self) -> RowsDtype {
        self.dtype
    }
}

/// Where a device encode puts its rows.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dest<'a> {
    /// A buffer the library allocates, of this dtype.
    Owned(RowsDtype),
    /// The caller's memory.
    Caller(&'a DeviceOut),
}

/// What a device encode gave: the owned rows (for [`Dest::Owned`]) and each image's row count.
pub(crate) struct DeviceResult {
    pub(crate) owned: Option<DeviceRows>,
    pub(crate) rows_per_image: Vec<usize>,
}

impl Tower {
    /// Runs `images` on the CUDA device in passes of at most `max_patches_per_pass` patches and
    /// writes every image's rows, in request order, into one buffer: the library's or the
    /// caller's (`dest`). The host is not blocked by the forward.
    pub(crate) fn run_device(
        &self,
        images: &Images<'_>,
        dest: Dest<'_>,
    ) -> Result<DeviceResult, InputError> {
        let patches = self.patches(images)?;
        let passes = pass_ranges(&patches, self.max_patches_per_pass())?;
        let precision = self.precision();
        let want = match dest {
            Dest::Owned(d) => d,
            Dest::Caller(out) => out.dtype,
        };
        if precision == Precision::F32 && want == RowsDtype::Bf16 {
            return Err(InputError::Message(
                "bf16 rows need a bf16 tower (cuBLASLt has no f32-input GEMM with a bf16 \
                 output); open the model in bf16 or ask for float32 rows"
                    .into(),
            ));
        }
        let job = Job {
            passes: &passes,
            patches: &patches,
            precision,
            dest,
        };
        match self.engine.cuda() {
            Some(c) => c.run_device(&job, images).unwrap_or_else(|| {
                Err(InputError::Message(format!(
                    "the {} tower was given another family's inputs",
                    self.family().name()
                )))
            }),
            None => Err(InputError::Message(format!(
                "rows on a GPU need a model opened on CUDA; this one runs on {} (its rows come \
                 back to the host as float32)",
                self.device()
            ))),
        }
    }
}

/// One device encode's passes and destination, run against any family's tower.
pub(crate) struct Job<'a> {
    passes: &'a [Range<usize>],
    patches: &'a [usize],
    precision: Precision,
    dest: Dest<'a>,
}

impl Job<'_> {
    fn pass_patches(&self, range: &Range<usize>) -> usize {
        self.patches[range.clone()]
            .iter()
            .fold(0usize, |a, &p| a.saturating_add(p))
    }

    /// The pass error wrapped with its images when the request has several passes.
    fn in_pass(&self, range: &Range<usize>, e: InputError) -> InputError {
        if self.passes.len() > 1 {
            InputError::Pass {
                first: range.start,
                last: range.end.saturating_sub(1),
                source: Box::new(e),
            }
        } else {
            e
        }
    }

    /// Runs the passes on `cuda` (a tower of `config`) over its family's `images`.
    pub(crate) fn run<T: CudaFamily>(
        &self,
        cuda: &Mutex<T>,
        config: &T::Config,
        images: &[T::Image<'_>],
    ) -> Result<DeviceResult, InputError> {
        // The host half of every pass first, before the device is taken.
        let mut hosts = Vec::with_capacity(self.passes.len());
        let mut rows_per_image = Vec::with_capacity(images.len());
        for range in self.passes {
            let host = T::prepare_host(config, self.precision, &images[range.clone()])
                .map_err(|e| self.in_pass(range, cuda_err(e, self.pass_patches(range))))?;
            let rows = T::rows_per_image(&host);
            hosts.push((host, rows.iter().sum::<usize>()));
            rows_per_image.extend(rows);
        }
        let total: usize = rows_per_image.iter().sum();
        let mut tower = cuda.lock().unwrap_or_else(PoisonError::into_inner);
        let width = tower.width();
        let dev = tower.device().clone();
        let all_patches = self
            .patches
            .iter()
            .fold(0usize, |a, &p| a.saturating_add(p));
        let gpu = |e: gpu_core::GpuError| InputError::gpu(e, all_patches);
        let need = total
            .checked_mul(width)
            .ok_or_else(|| InputError::Message(format!("{total} rows of {width} overflow")))?;
        let mut owned = None;
        let mut target: RowsTarget<'_> = match self.dest {
            Dest::Owned(dtype) => owned
                .insert(dev.alloc_rows(need, dtype).map_err(gpu)?)
                .target(),
            Dest::Caller(out) => {
                if out.len < need {
                    return Err(InputError::Message(format!(
                        "the output holds {} elements, the rows need {total} × {width} = {need}",
                        out.len
                    )));
                }
                if out.ordinal != dev.ordinal() {
                    return Err(InputError::Message(format!(
                        "the output is on cuda:{}, the model on cuda:{}",
                        out.ordinal,
                        dev.ordinal()
                    )));
                }
                // SAFETY: DeviceOut::new's contract: a live stream of this device's context.
                unsafe { dev.wait_for_stream(out.stream) }.map_err(gpu)?;
                // SAFETY: DeviceOut::new's contract: `len` elements of device memory of this
                // device, ordered after the caller's stream by the wait just queued.
                unsafe { RowsTarget::from_raw(out.addr, out.len, out.dtype, out.ordinal) }
            }
        };
        let mut row = 0;
        let mut result = Ok(());
        for ((host, rows), range) in hosts.into_iter().zip(self.passes) {
            let n = self.pass_patches(range);
            let pass = |tower: &mut T, target: &mut RowsTarget<'_>| -> Result<(), InputError> {
                let batch = tower.stage(host).map_err(|e| cuda_err(e, n))?;
                let out = target.range(row * width, rows * width).map_err(gpu)?;
                tower.run_into(&batch, out).map_err(|e| cuda_err(e, n))?;
                Ok(())
            };
            result = pass(&mut tower, &mut target).map_err(|e| self.in_pass(range, e));
            if result.is_err() {
                break;
            }
            row += rows;
        }
        // Ordered after everything queued, a failed pass too: the memory is freed (or handed to
        // the caller's stream) only after the kernels that may still write it.
        let ordered = match (&self.dest, &owned) {
            (Dest::Owned(_), Some(o)) => dev.mark_ready(o),
            // SAFETY: DeviceOut::new's contract, as above.
            (Dest::Caller(out), _) => unsafe { dev.signal_stream(out.stream) },
            (Dest::Owned(_), None) => Ok(()),
        };
        result?;
        ordered.map_err(gpu)?;
        let mut offsets = Vec::with_capacity(rows_per_image.len() + 1);
        offsets.push(0);
        for r in &rows_per_image {
            offsets.push(offsets.last().copied().unwrap_or(0) + r);
        }
        Ok(DeviceResult {
            owned: owned.map(|owned| DeviceRows {
                owned,
                offsets,
                width,
            }),
            rows_per_image,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows are handed to other threads (a Python consumer's deleter, an engine's worker).
    #[test]
    fn device_rows_and_outputs_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<DeviceRows>();
        send_sync::<DeviceOut>();
        send_sync::<crate::Model>();
    }
}
