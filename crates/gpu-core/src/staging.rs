//! A batch's inputs on their way to the device: host values ([`HostInputs`]), their device copy
//! ([`DeviceInputs`]: owned buffers, or a slot of an [`Uploader`] still being filled), and the
//! fixed buffers a forward reads ([`InputBuffers`]: a CUDA graph captures their addresses).
//!
//! [`Uploader`] overlaps uploads with compute: two slots of page-locked host memory and device
//! memory, a copy stream of its own, and two events per slot: `uploaded` (recorded on the copy
//! stream after the slot's copies; the compute stream waits on it before reading the slot) and
//! `consumed` (recorded on the compute stream after it copied the slot into the fixed buffers;
//! the copy stream waits on it before refilling the slot). So batch k+1 travels over PCIe while
//! the forward of batch k runs, and neither stream waits on the host.
//!
//! **Architecture Invariant:** the copy stream only ever writes an uploader's own slots; every
//! buffer a forward reads is written on the compute stream.
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaEvent, CudaStream, PinnedHostSlice};
use half::{bf16, f16};
use rayon::prelude::*;

use crate::{Device, DeviceBuffer, Elem, GemmBuffer, GpuError, Precision, Result};

/// Values per task when converting host values to bf16 in parallel.
const CONVERT_CHUNK: usize = 1 << 14;

/// How many bf16 conversion buffers are kept for the next batches (one per upload slot), and
/// the largest kept (bytes). Without them every encode converts its rows into fresh memory, and
/// glibc hands large freed blocks back to the kernel, so each call faults its rows in again page
/// by page: on the H200 host that was ~10 ms of a 19 ms gemma4 batch-1 encode (docs/PERF.md,
/// v0.7). The memory kept is at most `RECYCLED_BUFFERS × RECYCLED_MAX_BYTES` of host memory per
/// process, shared by every tower.
const RECYCLED_BUFFERS: usize = UPLOAD_SLOTS;
const RECYCLED_MAX_BYTES: usize = 256 << 20;

/// The bf16 conversion buffers of dropped [`HostGemm`]s, for the next conversions.
#[cfg(not(test))]
static RECYCLED: Mutex<Vec<Vec<bf16>>> = Mutex::new(Vec::new());

/// The pool, locked. Under `cargo test` each test thread has a pool of its own: the tests run
/// concurrently, and one test's conversion taking another's recycled buffer made the reuse test
/// fail at random (seen 2026-12-06 on the loaded 2-core machine); the pooling logic is the same.
#[cfg(not(test))]
fn pool() -> std::sync::MutexGuard<'static, Vec<Vec<bf16>>> {
    RECYCLED.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
fn pool() -> std::sync::MutexGuard<'static, Vec<Vec<bf16>>> {
    thread_local! {
        static RECYCLED: &'static Mutex<Vec<Vec<bf16>>> =
            Box::leak(Box::new(Mutex::new(Vec::new())));
    }
    RECYCLED.with(|m| m.lock().unwrap_or_else(PoisonError::into_inner))
}

/// A buffer of `n` bf16 values with unspecified contents, for a [`HostGemm::Bf16`] whose every
/// element a tower writes itself: the smallest of the conversion buffers kept from dropped
/// batches that holds `n` (no fresh memory per encode; see [`RECYCLED_BUFFERS`]), its old values
/// kept and zeros past them. Not zeroed whole: that was a serial 12 MB fill on the calling thread
/// for step3p7's six crops and global view at batch 1.
pub fn recycled_bf16(n: usize) -> Vec<bf16> {
    let mut v = kept_bf16(n).unwrap_or_default();
    // Cuts a longer buffer, lengthens a shorter one with zeros.
    v.resize(n, bf16::ZERO);
    v
}

/// The smallest kept conversion buffer with room for `n` values, taken out of the pool as it was.
fn kept_bf16(n: usize) -> Option<Vec<bf16>> {
    let mut pool = pool();
    let best = pool
        .iter()
        .enumerate()
        .filter(|(_, v)| v.capacity() >= n)
        .min_by_key(|(_, v)| v.capacity())
        .map(|(i, _)| i);
    best.map(|i| pool.swap_remove(i))
}

/// An empty buffer with room for `n` bf16 values: the smallest kept conversion buffer that holds
/// `n`, else a fresh one (whose pages the conversion's threads then fault in, in parallel).
fn take_bf16(n: usize) -> Vec<bf16> {
    let mut v = kept_bf16(n).unwrap_or_default();
    v.clear();
    v.reserve(n);
    v
}

/// The bits of `half::bf16::from_f32(f32::from_bits(x))` (round to nearest even; a NaN stays a
/// NaN with its sign and top mantissa bits, quiet bit set), written without branches so that the
/// conversion loop vectorises. Rounding: adding `0x7FFF` plus the kept part's lowest bit carries
/// into bit 16 exactly when the dropped half is above the tie, or at the tie with an odd kept
/// part; an overflow rounds to infinity as `half` does, and only a NaN could carry out of 32 bits.
#[inline(always)]
fn bf16_bits(x: u32) -> u16 {
    let rounded = x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16;
    let quiet_nan = (x >> 16) | 0x0040;
    (if x & 0x7FFF_FFFF > 0x7F80_0000 {
        quiet_nan
    } else {
        rounded
    }) as u16
}

/// Whether the f32 of bits `x` is a NaN or an infinity (all exponent bits set).
#[inline(always)]
fn non_finite_bits(x: u32) -> bool {
    x & 0x7FFF_FFFF >= 0x7F80_0000
}

/// Writes `src` converted to bf16 into `dst` (same length); whether every value was finite. Every
/// element of `dst` is written, whatever the values.
fn bf16_chunk(dst: &mut [MaybeUninit<bf16>], src: &[f32]) -> bool {
    let mut bad = false;
    for (d, &x) in dst.iter_mut().zip(src) {
        let b = x.to_bits();
        bad |= non_finite_bits(b);
        d.write(bf16::from_bits(bf16_bits(b)));
    }
    !bad
}

/// Writes `src` converted to f16 (round to nearest even) into `dst` (same length); whether every
/// converted value was finite: an f32 beyond f16's range (65504) becomes an infinity, and is
/// reported as non-finite like a NaN. Every element of `dst` is written, whatever the values.
fn f16_chunk(dst: &mut [MaybeUninit<f16>], src: &[f32]) -> bool {
    let mut bad = false;
    for (d, &x) in dst.iter_mut().zip(src) {
        let h = f16::from_f32(x);
        bad |= !h.is_finite();
        d.write(h);
    }
    !bad
}

/// Writes `src` into `dst` (same length); whether every value was finite. Every element of `dst`
/// is written.
fn f32_chunk(dst: &mut [MaybeUninit<f32>], src: &[f32]) -> bool {
    let mut bad = false;
    for (d, &x) in dst.iter_mut().zip(src) {
        bad |= non_finite_bits(x.to_bits());
        d.write(x);
    }
    !bad
}

/// Whether every value of `v` is finite (no NaN, no infinity): `v.iter().all(|x| x.is_finite())`,
/// in parallel chunks on the rayon pool and without a branch per value.
pub fn all_finite(v: &[f32]) -> bool {
    v.par_chunks(CONVERT_CHUNK)
        .map(|c| {
            !c.iter()
                .fold(false, |bad, x| bad | non_finite_bits(x.to_bits()))
        })
        .reduce(|| true, |a, b| a && b)
}

/// `parts` stacked in order into `out` (emptied first) by `chunk`, in parallel over the parts and
/// their chunks: one pass over the input, nothing written twice. Returns, per part, whether all
/// its values were finite.
fn stack_parts<T: Send>(
    parts: &[&[f32]],
    out: &mut Vec<T>,
    chunk: impl Fn(&mut [MaybeUninit<T>], &[f32]) -> bool + Sync,
) -> Vec<bool> {
    let n: usize = parts.iter().map(|s| s.len()).sum();
    out.clear();
    out.reserve(n);
    let mut rest = &mut out.spare_capacity_mut()[..n];
    let mut pairs = Vec::with_capacity(parts.len());
    for s in parts {
        let (dst, tail) = rest.split_at_mut(s.len());
        pairs.push((dst, *s));
        rest = tail;
    }
    // Every chunk of every part runs (`reduce`, not a short-circuiting `all`): the whole of
    // `out[..n]` is written whatever the values.
    let finite = pairs
        .into_par_iter()
        .map(|(dst, src)| {
            dst.par_chunks_mut(CONVERT_CHUNK)
                .zip(src.par_chunks(CONVERT_CHUNK))
                .map(|(d, s)| chunk(d, s))
                .reduce(|| true, |a, b| a && b)
        })
        .collect();
    // SAFETY: the parts' destinations tile `spare_capacity_mut()[..n]` (each split off at its
    // part's length, the lengths summing to `n`), each is zipped chunk by chunk with a source of
    // the same length, and `chunk` writes every element of its destination; every chunk ran
    // above (no short-circuit), so the first `n` elements are initialised.
    unsafe { out.set_len(n) };
    finite
}

/// A NaN or an infinity met by [`HostGemm::from_finite_f32_parts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("part {part} holds a non-finite value")]
pub struct NonFinite {
    /// The first part (in order) that holds one.
    pub part: usize,
}

/// Keeps `v` for a later conversion: while fewer than [`RECYCLED_BUFFERS`] are kept, or in place
/// of a smaller one; never one over [`RECYCLED_MAX_BYTES`].
fn recycle_bf16(v: Vec<bf16>) {
    let bytes = v.capacity() * std::mem::size_of::<bf16>();
    if bytes == 0 || bytes > RECYCLED_MAX_BYTES {
        return;
    }
    let mut pool = pool();
    if pool.len() < RECYCLED_BUFFERS {
        pool.push(v);
    } else if let Some(smallest) = pool
        .iter_mut()
        .filter(|k| k.capacity() < v.capacity())
        .min_by_key(|k| k.capacity())
    {
        *smallest = v;
    }
}

/// Host values in one GEMM precision: what a [`GemmBuffer`] is uploaded from.
#[derive(Debug, Clone, PartialEq)]
pub enum HostGemm {
    /// The product mode's bf16.
    Bf16(Vec<bf16>),
    /// f16 (IEEE half), the product mode of tiers without bf16.
    F16(Vec<f16>),
    /// The exactness mode's f32.
    F32(Vec<f32>),
}

impl HostGemm {
    /// `v` in precision `p` (bf16 and f16: rounded to nearest even, in parallel).
    pub fn from_f32(p: Precision, v: Vec<f32>) -> HostGemm {
        match p {
            Precision::Bf16 | Precision::F16 => HostGemm::from_f32_parts(p, &[&v]),
            Precision::F32 => HostGemm::F32(v),
        }
    }

    /// `parts` stacked in order, in precision `p`: bf16 converted straight from the parts in
    /// parallel (no f32 copy of the batch first) into a kept conversion buffer, written once (no
    /// zero fill first); f32 copied in parallel.
    pub fn from_f32_parts(p: Precision, parts: &[&[f32]]) -> HostGemm {
        Self::stacked(p, parts).0
    }

    /// [`HostGemm::from_f32_parts`], checking in the same pass over the values that each is
    /// finite (in f16: finite after the conversion, so a value beyond f16's range is refused too):
    /// the towers' inputs are refused on a NaN or an infinity, and reading tens of MB a
    /// second time only to check them cost as much as the conversion (docs/PERF.md v0.16).
    pub fn from_finite_f32_parts(p: Precision, parts: &[&[f32]]) -> Result<HostGemm, NonFinite> {
        let (out, finite) = Self::stacked(p, parts);
        match finite.iter().position(|&f| !f) {
            Some(part) => Err(NonFinite { part }),
            None => Ok(out),
        }
    }

    /// The stacked parts in precision `p`, and per part whether its values were all finite.
    fn stacked(p: Precision, parts: &[&[f32]]) -> (HostGemm, Vec<bool>) {
        let n = parts.iter().map(|s| s.len()).sum();
        match p {
            Precision::Bf16 => {
                let mut out = take_bf16(n);
                let finite = stack_parts(parts, &mut out, bf16_chunk);
                (HostGemm::Bf16(out), finite)
            }
            Precision::F16 => {
                let mut out = Vec::new();
                let finite = stack_parts(parts, &mut out, f16_chunk);
                (HostGemm::F16(out), finite)
            }
            Precision::F32 => {
                let mut out = Vec::new();
                let finite = stack_parts(parts, &mut out, f32_chunk);
                (HostGemm::F32(out), finite)
            }
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostGemm::Bf16(v) => v.len(),
            HostGemm::F16(v) => v.len(),
            HostGemm::F32(v) => v.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its precision.
    pub fn precision(&self) -> Precision {
        match self {
            HostGemm::Bf16(_) => Precision::Bf16,
            HostGemm::F16(_) => Precision::F16,
            HostGemm::F32(_) => Precision::F32,
        }
    }
}

impl Drop for HostGemm {
    /// A bf16 buffer goes back to the conversion buffers kept for the next batch.
    fn drop(&mut self) {
        if let HostGemm::Bf16(v) = self {
            recycle_bf16(std::mem::take(v));
        }
    }
}

/// The host inputs of one tower batch: patch rows in the GEMM precision, positions and
/// attention segment bounds (both i32).
#[derive(Debug, Clone, PartialEq)]
pub struct HostInputs {
    /// Patch rows `[tokens, k]`.
    pub rows: HostGemm,
    /// Positions `[tokens, 2]`.
    pub pos: Vec<i32>,
    /// Segment bounds `[segments + 1]`.
    pub cu: Vec<i32>,
}

impl HostInputs {
    fn lens(&self) -> [usize; 3] {
        [self.rows.len(), self.pos.len(), self.cu.len()]
    }
}

/// A batch's inputs on the device: buffers of its own (a synchronous upload) or a slot of an
/// [`Uploader`] (an asynchronous upload, valid until that slot is filled again).
#[derive(Debug)]
pub struct DeviceInputs {
    kind: InputsKind,
    /// Elements of rows, positions and segment bounds.
    lens: [usize; 3],
}

#[derive(Debug)]
enum InputsKind {
    Owned {
        rows: GemmBuffer,
        pos: DeviceBuffer<i32>,
        cu: DeviceBuffer<i32>,
    },
    Staged {
        uploader: u64,
        slot: usize,
        generation: u64,
    },
}

impl DeviceInputs {
    /// Elements of the patch rows.
    pub fn rows_len(&self) -> usize {
        self.lens[0]
    }
    /// Whether the inputs sit in an uploader's slot.
    pub fn is_staged(&self) -> bool {
        matches!(self.kind, InputsKind::Staged { .. })
    }
}

/// The fixed device buffers a forward reads its inputs from, sized for the largest batch so far.
#[derive(Debug)]
pub struct InputBuffers {
    /// Patch rows.
    pub rows: GemmBuffer,
    /// Positions.
    pub pos: DeviceBuffer<i32>,
    /// Segment bounds.
    pub cu: DeviceBuffer<i32>,
}

impl InputBuffers {
    /// Buffers for up to `rows`, `pos` and `cu` elements, in precision `p`.
    pub fn alloc(dev: &Device, p: Precision, rows: usize, pos: usize, cu: usize) -> Result<Self> {
        Ok(InputBuffers {
            rows: GemmBuffer::alloc(dev, p, rows)?,
            pos: dev.alloc(pos)?,
            cu: dev.alloc(cu)?,
        })
    }
}

fn upload_gemm(dev: &Device, v: &HostGemm) -> Result<GemmBuffer> {
    Ok(match v {
        HostGemm::Bf16(v) => GemmBuffer::Bf16(dev.upload(v)?),
        HostGemm::F16(v) => GemmBuffer::F16(dev.upload(v)?),
        HostGemm::F32(v) => GemmBuffer::F32(dev.upload(v)?),
    })
}

impl Device {
    /// Uploads `host` into buffers of its own, on the compute stream (synchronous for the host).
    pub fn upload_inputs(&self, host: &HostInputs) -> Result<DeviceInputs> {
        Ok(DeviceInputs {
            kind: InputsKind::Owned {
                rows: upload_gemm(self, &host.rows)?,
                pos: self.upload(&host.pos)?,
                cu: self.upload(&host.cu)?,
            },
            lens: host.lens(),
        })
    }

    /// Copies the first `len` elements of `src` into the start of `dst` (device to device, on
    /// the compute stream).
    pub fn copy_prefix<T: Elem>(
        &self,
        src: &DeviceBuffer<T>,
        len: usize,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        if len > src.len() || len > dst.len() {
            return Err(GpuError::shape(
                "copy_prefix",
                format!("{len} elements from {} into {}", src.len(), dst.len()),
            ));
        }
        if len == 0 {
            return Ok(());
        }
        let mut view = dst.slice.slice_mut(0..len);
        self.stream
            .memcpy_dtod(&src.slice.slice(0..len), &mut view)?;
        Ok(())
    }

    fn copy_gemm_prefix(&self, src: &GemmBuffer, len: usize, dst: &mut GemmBuffer) -> Result<()> {
        match (src, dst) {
            (GemmBuffer::Bf16(s), GemmBuffer::Bf16(d)) => self.copy_prefix(s, len, d),
            (GemmBuffer::F16(s), GemmBuffer::F16(d)) => self.copy_prefix(s, len, d),
            (GemmBuffer::F32(s), GemmBuffer::F32(d)) => self.copy_prefix(s, len, d),
            _ => Err(GpuError::shape(
                "load_inputs",
                "rows and buffer of different precisions",
            )),
        }
    }

    /// Copies a batch's inputs into the fixed buffers a forward reads, on the compute stream. A
    /// staged batch needs its `uploader`: the compute stream first waits (on the device) for the
    /// slot's upload, and the slot is marked free for the next upload after these copies.
    pub fn load_inputs(
        &self,
        src: &DeviceInputs,
        uploader: Option<&Uploader>,
        dst: &mut InputBuffers,
    ) -> Result<()> {
        let [nr, np, nc] = src.lens;
        match &src.kind {
            InputsKind::Owned { rows, pos, cu } => {
                self.copy_gemm_prefix(rows, nr, &mut dst.rows)?;
                self.copy_prefix(pos, np, &mut dst.pos)?;
                self.copy_prefix(cu, nc, &mut dst.cu)?;
            }
            InputsKind::Staged {
                uploader: id,
                slot,
                generation,
            } => {
                let up = uploader.filter(|u| u.id == *id).ok_or_else(|| {
                    GpuError::Staging("the batch was staged by another uploader".into())
                })?;
                let s = up
                    .slots
                    .get(*slot)
                    .filter(|s| s.generation == *generation)
                    .ok_or_else(|| {
                        GpuError::Staging(
                            "the batch's slot was refilled: run a staged batch before staging two more"
                                .into(),
                        )
                    })?;
                let d = s
                    .dev
                    .as_ref()
                    .ok_or_else(|| GpuError::Staging("the slot has no device memory".into()))?;
                self.stream.wait(&s.uploaded)?;
                self.copy_gemm_prefix(&d.rows, nr, &mut dst.rows)?;
                self.copy_prefix(&d.pos, np, &mut dst.pos)?;
                self.copy_prefix(&d.cu, nc, &mut dst.cu)?;
                s.consumed.record(&self.stream)?;
            }
        }
        Ok(())
    }
}

/// Page-locked host memory of either GEMM precision.
#[derive(Debug)]
enum PinnedRows {
    Bf16(PinnedHostSlice<bf16>),
    F16(PinnedHostSlice<f16>),
    F32(PinnedHostSlice<f32>),
}

#[derive(Debug)]
struct SlotHost {
    rows: PinnedRows,
    pos: PinnedHostSlice<i32>,
    cu: PinnedHostSlice<i32>,
}

#[derive(Debug)]
struct SlotDev {
    rows: GemmBuffer,
    pos: DeviceBuffer<i32>,
    cu: DeviceBuffer<i32>,
}

#[derive(Debug)]
struct Slot {
    generation: u64,
    /// Capacities of rows, positions and segment bounds (elements), and the rows' precision.
    cap: Option<([usize; 3], Precision)>,
    host: Option<SlotHost>,
    dev: Option<SlotDev>,
    /// Recorded on the copy stream after this slot's uploads.
    uploaded: CudaEvent,
    /// Recorded on the compute stream after it read this slot.
    consumed: CudaEvent,
}

static UPLOADERS: AtomicU64 = AtomicU64::new(1);

/// Double-buffered asynchronous uploads of batch inputs from page-locked host memory on a copy
/// stream of its own (see the module docs).
#[derive(Debug)]
pub struct Uploader {
    id: u64,
    stream: Arc<CudaStream>,
    slots: Vec<Slot>,
    next: usize,
    generation: u64,
}

/// Slots of an [`Uploader`]: a batch staged stays valid until two more are staged.
pub const UPLOAD_SLOTS: usize = 2;

impl Drop for Uploader {
    fn drop(&mut self) {
        // No copy may still read the page-locked memory the slots free below.
        let _ = self.stream.synchronize();
    }
}

/// Page-locked host memory for `len` elements (contents unspecified).
pub(crate) fn pinned<T: Elem>(dev: &Device, len: usize) -> Result<PinnedHostSlice<T>> {
    // SAFETY: T is plain old data (f32, bf16, f16, i32): any bit pattern is a value; flags 0 asks for
    // ordinary (cached, not write-combined) page-locked memory, which the host also reads.
    unsafe { dev.ctx.alloc_pinned_with_flags::<T>(len.max(1), 0) }
        .map_err(|e| GpuError::from_alloc(e, len * std::mem::size_of::<T>()))
}

/// Who copies a host batch into the upload slot's page-locked memory ([`Uploader::stage`]).
///
/// One thread copies at 5–6 GB/s on the GPU hosts: gemma4's 3.7 MB of bf16 patch rows took
/// 0.62–0.68 ms of a 14.6 ms batch-1 request (docs/PERF.md v0.29), and glm5_next's 25 MB at
/// 1920×1080 would take about 4.5. Never the rayon pool: in a
/// stream it is busy decoding the next pass, and a request that holds the tower's lock must not
/// queue behind another request's decode on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostCopy {
    /// The staging thread alone: for a stream of passes ([`crate::DeviceTower::stage`] from the
    /// device's thread), where every core is busy preparing the next pass.
    OneThread,
    /// The staging thread and up to [`SPREAD_COPY_THREADS`]` − 1` short-lived threads of their own,
    /// each a contiguous part of at least [`SPREAD_COPY_MIN_BYTES`]: for one request whose
    /// preparation is done, so the cores are idle while it waits on this copy.
    Spread,
}

/// The most threads (the staging thread included) a [`HostCopy::Spread`] copy uses: one core's
/// copy is bound by its own load and store queues, and several cores together reach most of the
/// host's memory bandwidth.
pub const SPREAD_COPY_THREADS: usize = 8;

/// The least bytes each thread of a [`HostCopy::Spread`] copy takes (a smaller copy stays on the
/// staging thread): the staging thread starts the others one after another, tens of µs each, the
/// time one thread copies a few hundred KiB in.
pub const SPREAD_COPY_MIN_BYTES: usize = 1 << 20;

/// The cores this process may run on, read once: on Linux `available_parallelism` reads the
/// affinity mask and the cgroup's quota files, tens of µs that a copy of a few hundred µs should
/// not pay each time.
fn host_cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// How many threads [`HostCopy::Spread`] uses for `bytes` on a host of `cores` cores (1: the
/// staging thread alone).
fn spread_threads(bytes: usize, cores: usize) -> usize {
    (bytes / SPREAD_COPY_MIN_BYTES).clamp(1, SPREAD_COPY_THREADS.min(cores.max(1)))
}

/// One part of a spread copy (destination, source), taken by the first thread to claim it.
type CopyPart<'a, T> = Mutex<Option<(&'a mut [T], &'a [T])>>;

/// Copies `src` into the start of `dst`, on the calling thread or spread as `how` says. A helper
/// thread that cannot be started leaves its part to the calling thread: the bytes are the same.
fn fill<T: Copy + Send + Sync>(dst: &mut [T], src: &[T], how: HostCopy) {
    let dst = &mut dst[..src.len()];
    let threads = match how {
        HostCopy::OneThread => 1,
        HostCopy::Spread => spread_threads(std::mem::size_of_val(src), host_cores()),
    };
    if threads <= 1 {
        dst.copy_from_slice(src);
        return;
    }
    let part = src.len().div_ceil(threads);
    // Each part is taken once, by whichever thread claims it first; the calling thread claims
    // parts too, so a helper that could not be started leaves its part to it.
    let parts: Vec<CopyPart<'_, T>> = dst
        .chunks_mut(part)
        .zip(src.chunks(part))
        .map(|p| Mutex::new(Some(p)))
        .collect();
    let next = AtomicUsize::new(0);
    let work = || {
        while let Some(slot) = parts.get(next.fetch_add(1, Ordering::Relaxed)) {
            let taken = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
            if let Some((d, s)) = taken {
                d.copy_from_slice(s);
            }
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..threads {
            // A thread that cannot be started (a thread limit) is no error: its part is claimed
            // by the others.
            let _ = std::thread::Builder::new()
                .name("vt-upload-copy".into())
                .spawn_scoped(scope, work);
        }
        work();
    });
}

impl Uploader {
    /// [`Uploader::stage`] on the uploader in `slot`, made on first use, after checking `host` was
    /// prepared in the tower's `precision` (the towers' `stage`).
    pub fn stage_into(
        slot: &mut Option<Uploader>,
        dev: &Device,
        precision: Precision,
        host: &HostInputs,
        copy: HostCopy,
    ) -> Result<DeviceInputs> {
        if host.rows.precision() != precision {
            return Err(GpuError::Staging(format!(
                "a batch prepared for {:?} staged on a {precision:?} tower",
                host.rows.precision()
            )));
        }
        let up = match slot {
            Some(up) => up,
            None => slot.insert(Uploader::new(dev)?),
        };
        up.stage(dev, host, copy)
    }

    /// An uploader with its own copy stream on `dev`; slot memory is allocated on first use.
    pub fn new(dev: &Device) -> Result<Uploader> {
        let stream = dev.ctx.new_stream()?;
        let mut slots = Vec::with_capacity(UPLOAD_SLOTS);
        for _ in 0..UPLOAD_SLOTS {
            slots.push(Slot {
                generation: 0,
                cap: None,
                host: None,
                dev: None,
                uploaded: dev.ctx.new_event(None)?,
                consumed: dev.ctx.new_event(None)?,
            });
        }
        Ok(Uploader {
            id: UPLOADERS.fetch_add(1, Ordering::Relaxed),
            stream,
            slots,
            next: 0,
            generation: 0,
        })
    }

    /// Bytes of page-locked host memory held by the slots.
    pub fn pinned_bytes(&self) -> usize {
        self.slots
            .iter()
            .filter_map(|s| s.host.as_ref())
            .map(|h| {
                let rows = match &h.rows {
                    PinnedRows::Bf16(p) => p.num_bytes(),
                    PinnedRows::F16(p) => p.num_bytes(),
                    PinnedRows::F32(p) => p.num_bytes(),
                };
                rows + h.pos.num_bytes() + h.cu.num_bytes()
            })
            .sum()
    }

    /// Copies `host` into the next slot's page-locked memory (by the threads `copy` says) and
    /// queues its upload on the copy stream; returns at once (the copies run while the compute
    /// stream works). The result is valid for [`Device::load_inputs`] until [`UPLOAD_SLOTS`]
    /// more batches are staged.
    pub fn stage(
        &mut self,
        dev: &Device,
        host: &HostInputs,
        copy: HostCopy,
    ) -> Result<DeviceInputs> {
        let index = self.next;
        self.next = (self.next + 1) % UPLOAD_SLOTS;
        let lens = host.lens();
        let p = host.rows.precision();
        let s = &mut self.slots[index];
        // This slot's previous copies have read its page-locked memory (normally long done).
        s.uploaded.synchronize()?;
        let fits = matches!(s.cap, Some((c, q)) if q == p && (0..3).all(|i| c[i] >= lens[i]));
        if !fits {
            let cap = lens.map(|n| n.max(1).next_power_of_two());
            s.host = None;
            s.dev = None;
            s.cap = None;
            let rows = match p {
                Precision::Bf16 => PinnedRows::Bf16(pinned(dev, cap[0])?),
                Precision::F16 => PinnedRows::F16(pinned(dev, cap[0])?),
                Precision::F32 => PinnedRows::F32(pinned(dev, cap[0])?),
            };
            s.host = Some(SlotHost {
                rows,
                pos: pinned(dev, cap[1])?,
                cu: pinned(dev, cap[2])?,
            });
            s.dev = Some(SlotDev {
                rows: GemmBuffer::alloc(dev, p, cap[0])?,
                pos: dev.alloc(cap[1])?,
                cu: dev.alloc(cap[2])?,
            });
            // The new device memory came from the compute stream's pool: let that stream reach
            // the allocation before the copy stream writes it (rare: only when a slot grows).
            dev.synchronize()?;
            s.cap = Some((cap, p));
        }
        let (Some(h), Some(d)) = (s.host.as_mut(), s.dev.as_mut()) else {
            return Err(GpuError::Staging(
                "slot memory missing after allocation".into(),
            ));
        };
        // The compute stream has copied this slot's previous batch out (device-side wait).
        self.stream.wait(&s.consumed)?;
        match (&mut h.rows, &host.rows, &mut d.rows) {
            (PinnedRows::Bf16(ph), HostGemm::Bf16(v), GemmBuffer::Bf16(dv)) => {
                let ph = ph.as_mut_slice()?;
                fill(ph, v, copy);
                queue(&self.stream, &ph[..v.len()], dv)?;
            }
            (PinnedRows::F16(ph), HostGemm::F16(v), GemmBuffer::F16(dv)) => {
                let ph = ph.as_mut_slice()?;
                fill(ph, v, copy);
                queue(&self.stream, &ph[..v.len()], dv)?;
            }
            (PinnedRows::F32(ph), HostGemm::F32(v), GemmBuffer::F32(dv)) => {
                let ph = ph.as_mut_slice()?;
                fill(ph, v, copy);
                queue(&self.stream, &ph[..v.len()], dv)?;
            }
            _ => return Err(GpuError::Staging("slot precision mismatch".into())),
        }
        let ph = h.pos.as_mut_slice()?;
        fill(ph, &host.pos, HostCopy::OneThread);
        queue(&self.stream, &ph[..host.pos.len()], &mut d.pos)?;
        let ch = h.cu.as_mut_slice()?;
        fill(ch, &host.cu, HostCopy::OneThread);
        queue(&self.stream, &ch[..host.cu.len()], &mut d.cu)?;
        s.uploaded.record(&self.stream)?;
        self.generation += 1;
        s.generation = self.generation;
        Ok(DeviceInputs {
            kind: InputsKind::Staged {
                uploader: self.id,
                slot: index,
                generation: self.generation,
            },
            lens,
        })
    }
}

/// Queues the upload of `src` (page-locked) into the start of `dst` on `stream`.
fn queue<T: Elem>(stream: &Arc<CudaStream>, src: &[T], dst: &mut DeviceBuffer<T>) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    if src.len() > dst.len() {
        return Err(GpuError::shape(
            "stage",
            format!("{} elements into a slot of {}", src.len(), dst.len()),
        ));
    }
    let mut view = dst.slice.slice_mut(0..src.len());
    // The source is page-locked, so the copy runs asynchronously; the caller keeps the memory
    // unchanged until the slot's `uploaded` event has completed.
    stream.memcpy_htod(src, &mut view)?;
    Ok(())
}

#[cfg(test)]
mod tests;
