//! Rows handed to a caller on the device: where a tower's final projection writes
//! ([`RowsTarget`]), library-owned rows that outlive the call ([`OwnedRows`]), and the ordering
//! between the tower's stream and a caller's stream.
//!
//! The ordering contract:
//! - A tower writes its rows on the device's compute stream; [`Device::mark_ready`] records
//!   the rows' `ready` event there after the last write.
//! - A consumer's stream is made to wait on that event ([`OwnedRows::wait_on_stream`]); the host
//!   is never blocked.
//! - Owned rows are freed on the device's release stream, after `ready` and after all work that
//!   every consumer stream had queued when the rows are dropped (an event recorded on each
//!   consumer stream at drop time, as PyTorch's `record_stream` does). A consumer stream that is
//!   capturing a CUDA graph at that moment cannot be waited on: its rows are kept in a deferred
//!   list and released by a later [`Device::alloc_rows`] or drop once the capture has ended.
//! - A caller's memory ([`RowsTarget::from_raw`]) is written after the compute stream has waited
//!   for all work the caller's stream had queued ([`Device::wait_for_stream`]), and the caller's
//!   stream waits for the rows afterwards ([`Device::signal_stream`]).
//!
//! Every context here is the device's primary context (cudarc retains it), the one PyTorch and
//! the CUDA runtime use, so the addresses are valid in the caller's framework.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr};

use crate::{Device, GpuError, Result};

/// The element type of rows handed to a caller: the LM's dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowsDtype {
    /// 32-bit float.
    F32,
    /// bfloat16 (rounded once from the f32 result, to nearest even).
    Bf16,
    /// float16 (IEEE half, rounded once from the f32 result, to nearest even; ±∞ beyond
    /// ±65504): an f16 LM's dtype.
    F16,
}

impl RowsDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            RowsDtype::F32 => 4,
            RowsDtype::Bf16 | RowsDtype::F16 => 2,
        }
    }

    /// `"float32"`, `"bfloat16"` or `"float16"` (PyTorch's spelling).
    pub fn name(self) -> &'static str {
        match self {
            RowsDtype::F32 => "float32",
            RowsDtype::Bf16 => "bfloat16",
            RowsDtype::F16 => "float16",
        }
    }
}

/// Where a tower's final projection writes: `len` elements of `dtype` of device memory on one
/// device, borrowed for `'a`.
#[derive(Debug)]
pub struct RowsTarget<'a> {
    pub(crate) addr: u64,
    pub(crate) len: usize,
    pub(crate) dtype: RowsDtype,
    pub(crate) ordinal: usize,
    _borrow: PhantomData<&'a mut ()>,
}

impl RowsTarget<'_> {
    /// A target over caller's memory: `len` elements of `dtype` at device address `addr` on CUDA
    /// device `ordinal`.
    ///
    /// # Safety
    /// `addr .. addr + len·size` must be device memory of that device's primary context (a
    /// `cudaMalloc`, `cuMemAlloc` or PyTorch allocation), writable, not read or written by
    /// anything else until the write is complete in stream order, and valid until then (an f16
    /// tower also reads it back in stream order right after its write, before its call returns:
    /// [`Device::rows_finite`]).
    pub unsafe fn from_raw(
        addr: u64,
        len: usize,
        dtype: RowsDtype,
        ordinal: usize,
    ) -> RowsTarget<'static> {
        RowsTarget {
            addr,
            len,
            dtype,
            ordinal,
            _borrow: PhantomData,
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

    /// The device address of its first element.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The `len` elements from element `start`, borrowed from this target.
    pub fn range(&mut self, start: usize, len: usize) -> Result<RowsTarget<'_>> {
        let end = start.checked_add(len);
        if end.is_none_or(|e| e > self.len) {
            return Err(GpuError::shape(
                "rows target",
                format!(
                    "elements {start}..{start}+{len} of a target of {}",
                    self.len
                ),
            ));
        }
        Ok(RowsTarget {
            addr: self.addr + (start * self.dtype.size()) as u64,
            len,
            dtype: self.dtype,
            ordinal: self.ordinal,
            _borrow: PhantomData,
        })
    }

    /// The same memory, borrowed again (to hand to one GEMM without giving the target up).
    pub fn reborrow(&mut self) -> RowsTarget<'_> {
        RowsTarget {
            addr: self.addr,
            len: self.len,
            dtype: self.dtype,
            ordinal: self.ordinal,
            _borrow: PhantomData,
        }
    }
}

/// Rows the library allocated on a device: freed when dropped, after the tower's writes and
/// after the work of every stream made to wait on them (module docs). `Send + Sync`: the drop
/// may run on any thread.
pub struct OwnedRows {
    /// `None` only while being dropped.
    mem: Option<CudaSlice<u8>>,
    addr: u64,
    len: usize,
    dtype: RowsDtype,
    ordinal: usize,
    ctx: Arc<CudaContext>,
    release: Arc<CudaStream>,
    /// Recorded on the compute stream after the last write ([`Device::mark_ready`]).
    ready: CudaEvent,
    /// Streams made to wait on `ready` (raw `CUstream` values; 0 = the legacy default stream).
    consumers: Mutex<Vec<u64>>,
}

impl std::fmt::Debug for OwnedRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedRows")
            .field("ordinal", &self.ordinal)
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("dtype", &self.dtype)
            .finish()
    }
}

/// The DLPack / array-API spelling of "the per-thread default stream" (`cudaStreamPerThread`).
pub const PER_THREAD_DEFAULT_STREAM: u64 = 2;

fn cu_stream(raw: u64) -> sys::CUstream {
    raw as usize as sys::CUstream
}

fn is_capturing(stream: sys::CUstream) -> Result<bool> {
    // SAFETY: `stream` is a live stream of the current context (the callers' contract).
    let status = unsafe { result::stream::is_capturing(stream) }?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Rows whose release waits for a consumer stream that was capturing a graph when they dropped.
static DEFERRED: Mutex<Vec<OwnedRows>> = Mutex::new(Vec::new());

impl OwnedRows {
    /// The device address of the first element.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The element type.
    pub fn dtype(&self) -> RowsDtype {
        self.dtype
    }

    /// The CUDA device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// A target over all of it, for the tower to write into.
    pub fn target(&mut self) -> RowsTarget<'_> {
        RowsTarget {
            addr: self.addr,
            len: self.len,
            dtype: self.dtype,
            ordinal: self.ordinal,
            _borrow: PhantomData,
        }
    }

    /// Makes `stream` wait (on the device, the host is not blocked) until the rows are written,
    /// and remembers it, so the memory is freed only after that stream's work queued before the
    /// drop. `0` is the legacy default stream, [`PER_THREAD_DEFAULT_STREAM`] the calling
    /// thread's per-thread default stream.
    ///
    /// # Safety
    /// `stream` must be a live stream of this device's primary context, and must stay alive until
    /// these rows are dropped (as for PyTorch's `record_stream`).
    pub unsafe fn wait_on_stream(&self, stream: u64) -> Result<()> {
        self.ctx.bind_to_thread()?;
        // SAFETY: the caller's contract; `ready` is an event of this context.
        unsafe {
            result::stream::wait_event(
                cu_stream(stream),
                self.ready.cu_event(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }?;
        // The per-thread default stream is a different stream on the thread that drops the rows;
        // the legacy default stream waits for it there (both are blocking streams).
        let remembered = if stream == PER_THREAD_DEFAULT_STREAM {
            0
        } else {
            stream
        };
        let mut c = self
            .consumers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !c.contains(&remembered) {
            c.push(remembered);
        }
        Ok(())
    }

    /// The event recorded after the tower's last write ([`Device::mark_ready`]).
    pub(crate) fn ready(&self) -> &CudaEvent {
        &self.ready
    }

    /// Blocks the calling thread until the rows are written.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.ready.synchronize()?)
    }

    /// The rows' bytes, copied to the host once they are written (blocks).
    pub fn download_bytes(&self) -> Result<Vec<u8>> {
        let Some(mem) = &self.mem else {
            return Ok(Vec::new());
        };
        self.ctx.bind_to_thread()?;
        self.release.wait(&self.ready)?;
        let bytes = self.release.clone_dtoh(mem)?;
        self.release.synchronize()?;
        Ok(bytes[..self.len * self.dtype.size()].to_vec())
    }

    /// The rows as f32 on the host (bf16 and f16 widened exactly), once written (blocks).
    pub fn download_f32(&self) -> Result<Vec<f32>> {
        let bytes = self.download_bytes()?;
        Ok(match self.dtype {
            RowsDtype::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            RowsDtype::Bf16 => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            RowsDtype::F16 => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
        })
    }

    /// Whether any consumer stream is capturing a graph now (the release must wait).
    fn consumer_capturing(&self) -> Result<bool> {
        let c = self
            .consumers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for &s in c.iter() {
            if s != 0 && is_capturing(cu_stream(s))? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Queues the free on the release stream after `ready` and after the work every consumer
    /// stream has queued now.
    fn release_now(&mut self) -> Result<()> {
        self.ctx.bind_to_thread()?;
        self.release.wait(&self.ready)?;
        let consumers = std::mem::take(
            &mut *self
                .consumers
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for s in consumers {
            let e = self.ctx.new_event(None)?;
            // SAFETY: `s` was a live stream when it was made to wait and the caller of
            // `wait_on_stream` keeps it alive until this drop; `e` is an event of this context.
            unsafe { result::event::record(e.cu_event(), cu_stream(s)) }?;
            self.release.wait(&e)?;
        }
        // CudaSlice's drop frees on the stream it was allocated on: the release stream.
        drop(self.mem.take());
        Ok(())
    }
}

impl Drop for OwnedRows {
    fn drop(&mut self) {
        if self.mem.is_none() {
            return;
        }
        if self.ctx.bind_to_thread().is_ok() && matches!(self.consumer_capturing(), Ok(true)) {
            let rows = OwnedRows {
                mem: self.mem.take(),
                addr: self.addr,
                len: self.len,
                dtype: self.dtype,
                ordinal: self.ordinal,
                ctx: self.ctx.clone(),
                release: self.release.clone(),
                ready: match self.ctx.new_event(None) {
                    Ok(e) => std::mem::replace(&mut self.ready, e),
                    // Without a fresh event the rows cannot be parked: release them now.
                    Err(_) => {
                        let _ = self.release_now();
                        return;
                    }
                },
                consumers: Mutex::new(std::mem::take(
                    &mut *self
                        .consumers
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner),
                )),
            };
            DEFERRED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(rows);
            return;
        }
        // A failure here (a lost device) leaves the memory to the driver; nothing to report to.
        let _ = self.release_now();
    }
}

/// Releases every deferred rows buffer whose consumers are no longer capturing.
fn release_deferred() {
    let parked = std::mem::take(&mut *DEFERRED.lock().unwrap_or_else(PoisonError::into_inner));
    let mut still = Vec::new();
    for rows in parked {
        if matches!(rows.consumer_capturing(), Ok(false)) {
            drop(rows);
        } else {
            still.push(rows);
        }
    }
    if !still.is_empty() {
        DEFERRED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(still);
    }
}

impl Device {
    /// Allocates `len` elements of `dtype` for rows a caller will own (contents unspecified
    /// until a tower writes them; 0xff bytes, NaN, under [`crate::POISON_ALLOC_ENV`], as
    /// [`Device::alloc`]'s). The memory comes from the release stream's pool and the compute
    /// stream is ordered after the allocation.
    pub fn alloc_rows(&self, len: usize, dtype: RowsDtype) -> Result<OwnedRows> {
        release_deferred();
        let bytes = len
            .checked_mul(dtype.size())
            .ok_or(GpuError::OutOfMemory { bytes: usize::MAX })?;
        // SAFETY: bytes whose contents are unspecified until the tower writes them; they are
        // only read back (as plain data) after `ready`.
        let mem = unsafe { self.release.alloc::<u8>(bytes.max(1)) }
            .map_err(|e| GpuError::from_alloc(e, bytes))?;
        let addr = {
            // event tracking is off on our context: the guard records nothing
            let (addr, _guard) = mem.device_ptr(&self.release);
            addr
        };
        if self.poison_alloc {
            // SAFETY: `addr` holds `bytes.max(1)` bytes of the allocation just made, ordered on
            // the release stream, which the compute stream waits for below.
            unsafe { result::memset_d8_async(addr, 0xff, bytes.max(1), self.release.cu_stream()) }?;
        }
        let allocated = self.ctx.new_event(None)?;
        allocated.record(&self.release)?;
        self.stream.wait(&allocated)?;
        Ok(OwnedRows {
            mem: Some(mem),
            addr,
            len,
            dtype,
            ordinal: self.ctx.ordinal(),
            ctx: self.ctx.clone(),
            release: self.release.clone(),
            ready: self.ctx.new_event(None)?,
            consumers: Mutex::new(Vec::new()),
        })
    }

    /// Records `rows`' ready event on the compute stream: everything queued there so far (the
    /// tower's writes) happens before any stream waiting on the rows proceeds.
    pub fn mark_ready(&self, rows: &OwnedRows) -> Result<()> {
        Ok(rows.ready.record(&self.stream)?)
    }

    /// Makes the compute stream wait for all work `stream` has queued now (a caller's stream
    /// whose buffer the tower is about to write).
    ///
    /// # Safety
    /// `stream` must be a live stream of this device's primary context (0 = legacy default,
    /// [`PER_THREAD_DEFAULT_STREAM`] = the calling thread's).
    pub unsafe fn wait_for_stream(&self, stream: u64) -> Result<()> {
        self.ctx.bind_to_thread()?;
        let e = self.ctx.new_event(None)?;
        // SAFETY: the caller's contract.
        unsafe { result::event::record(e.cu_event(), cu_stream(stream)) }?;
        Ok(self.stream.wait(&e)?)
    }

    /// Makes `stream` wait for all work queued on the compute stream so far (the rows a tower
    /// wrote into a caller's buffer).
    ///
    /// # Safety
    /// As [`Device::wait_for_stream`].
    pub unsafe fn signal_stream(&self, stream: u64) -> Result<()> {
        self.ctx.bind_to_thread()?;
        let e = self.ctx.new_event(None)?;
        e.record(&self.stream)?;
        // SAFETY: the caller's contract; `e` is an event of this context.
        unsafe {
            result::stream::wait_event(
                cu_stream(stream),
                e.cu_event(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }?;
        Ok(())
    }

    /// The CUDA device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Checks that `target` lives on this device.
    /// Whether every element of `target` is finite (no NaN, no ±∞), read back after all work
    /// queued on the compute stream so far (it waits): an f16 tower's rows are checked so
    /// ([`crate::DeviceTower::run_into`]), since f16 overflows at 65504.
    pub fn rows_finite(&self, target: &RowsTarget<'_>) -> Result<bool> {
        self.check_target(target)?;
        if target.len == 0 {
            return Ok(true);
        }
        self.ctx.bind_to_thread()?;
        let mut bytes = vec![0u8; target.len * target.dtype.size()];
        // SAFETY: `target` is `len` elements of device memory of this device (its constructor's
        // contract, ordinal checked above), valid for the borrow; the copy is queued on the
        // compute stream after the writes to it and waited for before `bytes` is read or freed.
        unsafe { result::memcpy_dtoh_async(&mut bytes[..], target.addr, self.stream.cu_stream()) }?;
        self.stream.synchronize()?;
        Ok(match target.dtype {
            RowsDtype::F32 => bytes
                .chunks_exact(4)
                .all(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite()),
            RowsDtype::Bf16 => bytes
                .chunks_exact(2)
                .all(|c| half::bf16::from_le_bytes([c[0], c[1]]).is_finite()),
            RowsDtype::F16 => bytes
                .chunks_exact(2)
                .all(|c| half::f16::from_le_bytes([c[0], c[1]]).is_finite()),
        })
    }

    pub(crate) fn check_target(&self, target: &RowsTarget<'_>) -> Result<()> {
        if target.ordinal != self.ordinal() {
            return Err(GpuError::shape(
                "rows target",
                format!(
                    "memory on cuda:{} given to a tower on cuda:{}",
                    target.ordinal,
                    self.ordinal()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_sizes_and_names() {
        assert_eq!(RowsDtype::F32.size(), 4);
        assert_eq!(RowsDtype::Bf16.size(), 2);
        assert_eq!(RowsDtype::Bf16.name(), "bfloat16");
        assert_eq!(RowsDtype::F16.size(), 2);
        assert_eq!(RowsDtype::F16.name(), "float16");
    }

    #[test]
    fn a_range_past_the_target_is_an_error_and_offsets_are_in_bytes() {
        // SAFETY: never written through: only address arithmetic is tested.
        let mut t = unsafe { RowsTarget::from_raw(0x1000, 10, RowsDtype::Bf16, 0) };
        assert!(t.range(8, 3).is_err());
        assert!(t.range(usize::MAX, 2).is_err());
        let r = t.range(4, 6).map(|r| (r.addr(), r.len()));
        assert_eq!(r.ok(), Some((0x1000 + 8, 6)));
    }
}
