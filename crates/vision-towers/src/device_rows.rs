//! Rows that stay on the GPU: one device buffer per request in the LM's dtype, per-image row
//! offsets, and the ordering contract with the caller's stream (see [`gpu_core::OwnedRows`]).

use std::ops::Range;
use std::time::Duration;

use gpu_core::{OwnedRows, RowsDtype};

use crate::tower_error::InputError;
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
    /// Rows in `owned`, `width` columns, image `i` at rows `offsets[i]..offsets[i + 1]`.
    pub(crate) fn new(owned: OwnedRows, offsets: Vec<usize>, width: usize) -> DeviceRows {
        DeviceRows {
            owned,
            offsets,
            width,
        }
    }

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
    pub(crate) addr: u64,
    pub(crate) len: usize,
    pub(crate) dtype: RowsDtype,
    pub(crate) ordinal: usize,
    pub(crate) stream: u64,
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

/// What a device encode gave: the owned rows (for [`Dest::Owned`]), each image's row count and
/// where the host's time went after the images were prepared.
pub(crate) struct DeviceResult {
    pub(crate) owned: Option<DeviceRows>,
    pub(crate) rows_per_image: Vec<usize>,
    pub(crate) timings: RequestTimings,
}

/// Where one device request's time went on the host, stage by stage (wall clock, each stage's
/// own duration; the stages run one after another in this order). The call returns once the
/// work is queued, so the device's remaining time is what the caller's wait on the rows takes
/// (`DeviceRows::synchronize`); `xtask api-bench` prints both (docs/PERF.md, issue 43).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RequestTimings {
    /// Admission, decode, resize, normalisation and patchify of every image (images in
    /// parallel on the worker pool).
    pub prepare: Duration,
    /// The tower's host half of every pass: the patch rows laid out in the GEMM precision.
    pub host_layout: Duration,
    /// Waiting for the tower (another request may hold it) and setting up the rows' buffer:
    /// the library's allocation, or the caller's stream ordered before the work.
    pub device_setup: Duration,
    /// Every pass's inputs copied to page-locked memory and their uploads queued.
    pub upload: Duration,
    /// Every pass's forward queued (a graph replay or the kernels' launches) and the rows'
    /// ready signal recorded.
    pub launch: Duration,
}

impl RequestTimings {
    /// The host's time in all, until the call returned.
    pub fn total(&self) -> Duration {
        self.prepare + self.host_layout + self.device_setup + self.upload + self.launch
    }
}

/// One device encode's passes and destination, run against any family's tower.
pub(crate) struct Job<'a> {
    pub(crate) passes: &'a [Range<usize>],
    pub(crate) patches: &'a [usize],
    pub(crate) precision: Precision,
    pub(crate) dest: Dest<'a>,
}

impl Job<'_> {
    pub(crate) fn pass_patches(&self, range: &Range<usize>) -> usize {
        self.patches[range.clone()]
            .iter()
            .fold(0usize, |a, &p| a.saturating_add(p))
    }

    /// The pass error wrapped with its images when the request has several passes.
    pub(crate) fn in_pass(&self, range: &Range<usize>, e: InputError) -> InputError {
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
}

/// Why a tower of precision `p` cannot write rows of `dtype` on the device, or `None` when it
/// can: cuBLASLt writes f32 from every input type, and a 16-bit output only from inputs of that
/// same type (bf16 → bf16, f16 → f16), so f32 towers give f32 rows only.
pub fn rows_dtype_refusal(p: Precision, dtype: RowsDtype) -> Option<String> {
    let same = match (p, dtype) {
        (_, RowsDtype::F32) => return None,
        (Precision::Bf16, RowsDtype::Bf16) | (Precision::F16, RowsDtype::F16) => return None,
        (Precision::F32 | Precision::F16, RowsDtype::Bf16) => "bf16",
        (Precision::F32 | Precision::Bf16, RowsDtype::F16) => "f16",
    };
    Some(format!(
        "{} rows need a {same} tower (cuBLASLt has no {p}-input GEMM with a {} output); open the \
         model in {same} or ask for float32 rows",
        dtype.name(),
        dtype.name()
    ))
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

    /// f32 rows from every tower; a 16-bit dtype only from a tower of that dtype.
    #[test]
    fn rows_dtype_follows_the_tower_precision() {
        for p in Precision::ALL {
            assert_eq!(rows_dtype_refusal(p, RowsDtype::F32), None, "{p}");
        }
        assert_eq!(rows_dtype_refusal(Precision::Bf16, RowsDtype::Bf16), None);
        assert_eq!(rows_dtype_refusal(Precision::F16, RowsDtype::F16), None);
        for (p, d, name) in [
            (Precision::F32, RowsDtype::Bf16, "bf16"),
            (Precision::F16, RowsDtype::Bf16, "bf16"),
            (Precision::F32, RowsDtype::F16, "f16"),
            (Precision::Bf16, RowsDtype::F16, "f16"),
        ] {
            let e = rows_dtype_refusal(p, d).expect("refused");
            assert!(
                e.contains(&format!("need a {name} tower")) && e.contains("float32 rows"),
                "{e}"
            );
        }
    }
}
