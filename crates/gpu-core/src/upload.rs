//! Weight upload without a host copy of the whole tensor: a [`HostSource`] (a slice, the
//! little-endian bytes of a memory-mapped file, or a transform of either) is read chunk by chunk,
//! each chunk converted in parallel straight into one of two page-locked staging buffers of a
//! [`Stager`] and copied to the device while the next chunk is converted.
use cudarc::driver::{CudaEvent, PinnedHostSlice};
use half::{bf16, f16};
use rayon::prelude::*;

use crate::{Device, DeviceBuffer, Elem, GemmBuffer, GpuError, Precision, Result};

/// Host values a device buffer is filled from, read in ranges (in parallel, so `Sync`).
pub trait HostSource: Sync {
    /// Number of elements.
    fn len(&self) -> usize;
    /// Whether it has no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Writes elements `start .. start + out.len()` as f32 (`start + out.len() ≤ len`).
    fn read_f32(&self, start: usize, out: &mut [f32]);
    /// Writes elements `start .. start + out.len()` as bf16, rounded to nearest even.
    fn read_bf16(&self, start: usize, out: &mut [bf16]) {
        let mut tmp = [0.0f32; 1024];
        for (i, o) in out.chunks_mut(tmp.len()).enumerate() {
            let t = &mut tmp[..o.len()];
            self.read_f32(start + i * 1024, t);
            for (d, s) in o.iter_mut().zip(t.iter()) {
                *d = bf16::from_f32(*s);
            }
        }
    }
    /// Writes elements `start .. start + out.len()` as f16, rounded to nearest even (±∞ beyond
    /// ±65504: a caller that uploads f16 weights checks their range).
    fn read_f16(&self, start: usize, out: &mut [f16]) {
        let mut tmp = [0.0f32; 1024];
        for (i, o) in out.chunks_mut(tmp.len()).enumerate() {
            let t = &mut tmp[..o.len()];
            self.read_f32(start + i * 1024, t);
            for (d, s) in o.iter_mut().zip(t.iter()) {
                *d = f16::from_f32(*s);
            }
        }
    }
    /// All elements as f32, read in parallel (for the small tensors and the transformed ones).
    fn to_f32_vec(&self) -> Vec<f32> {
        let mut v = vec![0.0f32; self.len()];
        v.par_chunks_mut(TASK)
            .enumerate()
            .for_each(|(i, out)| self.read_f32(i * TASK, out));
        v
    }
}

impl HostSource for [f32] {
    fn len(&self) -> usize {
        <[f32]>::len(self)
    }
    fn read_f32(&self, start: usize, out: &mut [f32]) {
        out.copy_from_slice(&self[start..start + out.len()]);
    }
    fn read_bf16(&self, start: usize, out: &mut [bf16]) {
        let n = out.len();
        for (d, s) in out.iter_mut().zip(&self[start..start + n]) {
            *d = bf16::from_f32(*s);
        }
    }
    fn read_f16(&self, start: usize, out: &mut [f16]) {
        let n = out.len();
        for (d, s) in out.iter_mut().zip(&self[start..start + n]) {
            *d = f16::from_f32(*s);
        }
    }
}

impl HostSource for Vec<f32> {
    fn len(&self) -> usize {
        self.as_slice().len()
    }
    fn read_f32(&self, start: usize, out: &mut [f32]) {
        self.as_slice().read_f32(start, out)
    }
    fn read_bf16(&self, start: usize, out: &mut [bf16]) {
        self.as_slice().read_bf16(start, out)
    }
    fn read_f16(&self, start: usize, out: &mut [f16]) {
        self.as_slice().read_f16(start, out)
    }
}

/// The element type of little-endian float bytes (a safetensors or GGUF tensor's data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeDtype {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
}

impl LeDtype {
    /// The float type a safetensors header spells `F32`, `F16` or `BF16`; `None` for any other.
    pub fn from_safetensors(spelling: &str) -> Option<LeDtype> {
        match spelling {
            "F32" => Some(LeDtype::F32),
            "F16" => Some(LeDtype::F16),
            "BF16" => Some(LeDtype::Bf16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            LeDtype::F32 => 4,
            LeDtype::F16 | LeDtype::Bf16 => 2,
        }
    }
}

/// Little-endian float bytes, e.g. a tensor inside a memory-mapped file; bf16 bytes are read
/// into bf16 as they are (no f32 in between).
#[derive(Debug, Clone, Copy)]
pub struct LeBytes<'a> {
    bytes: &'a [u8],
    dtype: LeDtype,
}

impl<'a> LeBytes<'a> {
    /// `bytes` as elements of `dtype`; a length that is not a whole number of elements is a
    /// [`GpuError::Shape`].
    pub fn new(bytes: &'a [u8], dtype: LeDtype) -> Result<LeBytes<'a>> {
        if !bytes.len().is_multiple_of(dtype.size()) {
            return Err(GpuError::shape(
                "LeBytes",
                format!("{} bytes are not whole {dtype:?} elements", bytes.len()),
            ));
        }
        Ok(LeBytes { bytes, dtype })
    }

    fn at(&self, start: usize, n: usize) -> &'a [u8] {
        let s = self.dtype.size();
        &self.bytes[start * s..(start + n) * s]
    }
}

impl HostSource for LeBytes<'_> {
    fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size()
    }
    fn read_f32(&self, start: usize, out: &mut [f32]) {
        let b = self.at(start, out.len());
        match self.dtype {
            LeDtype::F32 => {
                for (d, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                    *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            LeDtype::F16 => {
                for (d, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *d = f16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
            LeDtype::Bf16 => {
                for (d, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *d = bf16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
        }
    }
    fn read_bf16(&self, start: usize, out: &mut [bf16]) {
        let b = self.at(start, out.len());
        match self.dtype {
            LeDtype::Bf16 => {
                for (d, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *d = bf16::from_le_bytes([c[0], c[1]]);
                }
            }
            LeDtype::F32 => {
                for (d, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                    *d = bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                }
            }
            LeDtype::F16 => {
                for (d, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *d = bf16::from_f32(f16::from_le_bytes([c[0], c[1]]).to_f32());
                }
            }
        }
    }
    fn read_f16(&self, start: usize, out: &mut [f16]) {
        let b = self.at(start, out.len());
        match self.dtype {
            LeDtype::F16 => {
                for (d, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *d = f16::from_le_bytes([c[0], c[1]]);
                }
            }
            LeDtype::F32 => {
                for (d, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                    *d = f16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                }
            }
            LeDtype::Bf16 => {
                // bf16 → f32 is exact, so this rounds once
                for (d, c) in out.iter_mut().zip(b.chunks_exact(2)) {
                    *d = f16::from_f32(bf16::from_le_bytes([c[0], c[1]]).to_f32());
                }
            }
        }
    }
}

/// A host tensor on its way to the device: bytes of a memory-mapped file, owned f32 values (a
/// tensor the reader had to decode, e.g. a quantised one), or tensors stacked row-wise (fused
/// projections). Reading it never copies more than the range asked for.
#[derive(Debug, Clone)]
pub enum HostTensor<'a> {
    /// Little-endian float bytes, read in place.
    Bytes(LeBytes<'a>),
    /// Decoded values.
    F32(Vec<f32>),
    /// Borrowed f32 values.
    Slice(&'a [f32]),
    /// The concatenation of the parts, in order.
    Stack(Vec<HostTensor<'a>>),
}

impl<'a> HostTensor<'a> {
    /// `bytes` read in place when `dtype` is a float type they hold whole elements of; else the
    /// f32 values `decode` gives (a quantised tensor, or bytes that do not split into elements).
    pub fn in_place<E>(
        bytes: &'a [u8],
        dtype: Option<LeDtype>,
        decode: impl FnOnce() -> std::result::Result<Vec<f32>, E>,
    ) -> std::result::Result<HostTensor<'a>, E> {
        match dtype.and_then(|d| LeBytes::new(bytes, d).ok()) {
            Some(b) => Ok(HostTensor::Bytes(b)),
            None => Ok(HostTensor::F32(decode()?)),
        }
    }
}

impl HostTensor<'_> {
    /// Calls `f(part, offset in part, offset in out, n)` for the parts covering `start ..
    /// start + n` of a stack.
    fn spans(
        parts: &[HostTensor<'_>],
        start: usize,
        n: usize,
        mut f: impl FnMut(&HostTensor<'_>, usize, usize, usize),
    ) {
        let (mut base, mut done) = (0usize, 0usize);
        for p in parts {
            let len = p.len();
            let at = start + done;
            if done == n {
                break;
            }
            if at < base + len {
                let off = at - base;
                let take = (len - off).min(n - done);
                f(p, off, done, take);
                done += take;
            }
            base += len;
        }
    }
}

impl HostSource for HostTensor<'_> {
    fn len(&self) -> usize {
        match self {
            HostTensor::Bytes(b) => b.len(),
            HostTensor::F32(v) => v.len(),
            HostTensor::Slice(v) => v.len(),
            HostTensor::Stack(p) => p.iter().map(HostTensor::len).sum(),
        }
    }
    fn read_f32(&self, start: usize, out: &mut [f32]) {
        match self {
            HostTensor::Bytes(b) => b.read_f32(start, out),
            HostTensor::F32(v) => v.read_f32(start, out),
            HostTensor::Slice(v) => v.read_f32(start, out),
            HostTensor::Stack(p) => HostTensor::spans(p, start, out.len(), |t, off, at, n| {
                t.read_f32(off, &mut out[at..at + n])
            }),
        }
    }
    fn read_bf16(&self, start: usize, out: &mut [bf16]) {
        match self {
            HostTensor::Bytes(b) => b.read_bf16(start, out),
            HostTensor::F32(v) => v.read_bf16(start, out),
            HostTensor::Slice(v) => v.read_bf16(start, out),
            HostTensor::Stack(p) => HostTensor::spans(p, start, out.len(), |t, off, at, n| {
                t.read_bf16(off, &mut out[at..at + n])
            }),
        }
    }
    fn read_f16(&self, start: usize, out: &mut [f16]) {
        match self {
            HostTensor::Bytes(b) => b.read_f16(start, out),
            HostTensor::F32(v) => v.read_f16(start, out),
            HostTensor::Slice(v) => v.read_f16(start, out),
            HostTensor::Stack(p) => HostTensor::spans(p, start, out.len(), |t, off, at, n| {
                t.read_f16(off, &mut out[at..at + n])
            }),
        }
    }
}

/// How a weight loader holds a tensor: owned f32 values (the host reference path) or a
/// [`HostTensor`] read from the file only when uploaded (the CUDA path), so one loader serves
/// both and the CUDA path never holds the model in f32.
pub trait TensorStore: HostSource + Sized + Send {
    /// Owned values (a tensor the loader rearranged, e.g. a conv weight's columns).
    fn from_f32(v: Vec<f32>) -> Self;
    /// The parts stacked row-wise, in order.
    fn stack(parts: Vec<Self>) -> Self;
    /// A borrowed view of it (no values copied), e.g. to stack with other tensors at upload.
    fn view(&self) -> HostTensor<'_>;
}

impl TensorStore for Vec<f32> {
    fn from_f32(v: Vec<f32>) -> Self {
        v
    }
    fn stack(parts: Vec<Self>) -> Self {
        parts.concat()
    }
    fn view(&self) -> HostTensor<'_> {
        HostTensor::Slice(self)
    }
}

impl TensorStore for HostTensor<'_> {
    fn from_f32(v: Vec<f32>) -> Self {
        HostTensor::F32(v)
    }
    fn stack(parts: Vec<Self>) -> Self {
        HostTensor::Stack(parts)
    }
    fn view(&self) -> HostTensor<'_> {
        match self {
            HostTensor::Bytes(b) => HostTensor::Bytes(*b),
            HostTensor::F32(v) => HostTensor::Slice(v),
            HostTensor::Slice(v) => HostTensor::Slice(v),
            HostTensor::Stack(p) => HostTensor::Stack(p.iter().map(TensorStore::view).collect()),
        }
    }
}

/// Element types a [`Stager`] uploads into (f32, bf16, f16).
pub trait StageElem: Elem + sealed::Sealed {
    #[doc(hidden)]
    fn read(src: &dyn HostSource, start: usize, out: &mut [Self]);
}
mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}
impl StageElem for f32 {
    fn read(src: &dyn HostSource, start: usize, out: &mut [f32]) {
        src.read_f32(start, out)
    }
}
impl StageElem for bf16 {
    fn read(src: &dyn HostSource, start: usize, out: &mut [bf16]) {
        src.read_bf16(start, out)
    }
}
impl StageElem for f16 {
    fn read(src: &dyn HostSource, start: usize, out: &mut [f16]) {
        src.read_f16(start, out)
    }
}

/// Bytes of one staging buffer (two are held).
pub const STAGING_BYTES: usize = 16 << 20;
/// Elements one rayon task converts.
const TASK: usize = 1 << 15;

/// Two reusable page-locked staging buffers and their copy events, for uploading many tensors
/// (one model) without a pageable copy or a whole-tensor host buffer. Uploads run on the
/// device's compute stream; a buffer is refilled only after its previous copy finished.
pub struct Stager {
    bufs: Vec<(PinnedHostSlice<u8>, CudaEvent)>,
    next: usize,
    uploaded: usize,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("uploaded", &self.uploaded)
            .finish_non_exhaustive()
    }
}

impl Drop for Stager {
    fn drop(&mut self) {
        // No copy may still read the page-locked memory freed below.
        for (_, e) in &self.bufs {
            let _ = e.synchronize();
        }
    }
}

impl Stager {
    /// Allocates the two staging buffers on `dev` (2 × [`STAGING_BYTES`] of page-locked memory).
    pub fn new(dev: &Device) -> Result<Stager> {
        let mut bufs = Vec::with_capacity(2);
        for _ in 0..2 {
            // SAFETY: bytes; every bit pattern is valid and the buffer is written before use.
            let b = unsafe { dev.ctx.alloc_pinned_with_flags::<u8>(STAGING_BYTES, 0) }
                .map_err(|e| GpuError::from_alloc(e, STAGING_BYTES))?;
            bufs.push((b, dev.ctx.new_event(None)?));
        }
        Ok(Stager {
            bufs,
            next: 0,
            uploaded: 0,
        })
    }

    /// Bytes uploaded through this stager so far.
    pub fn uploaded_bytes(&self) -> usize {
        self.uploaded
    }

    /// Uploads all of `src` as `T` into a new device buffer.
    pub fn upload<T: StageElem>(
        &mut self,
        dev: &Device,
        src: &dyn HostSource,
    ) -> Result<DeviceBuffer<T>> {
        let mut dst = dev.alloc::<T>(src.len())?;
        self.upload_into(dev, src, &mut dst)?;
        Ok(dst)
    }

    /// Uploads all of `src` as `T` into the start of `dst`.
    pub fn upload_into<T: StageElem>(
        &mut self,
        dev: &Device,
        src: &dyn HostSource,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let n = src.len();
        if n > dst.len() {
            return Err(GpuError::shape(
                "Stager::upload",
                format!("{n} elements into a buffer of {}", dst.len()),
            ));
        }
        let per = STAGING_BYTES / std::mem::size_of::<T>();
        let mut start = 0;
        while start < n {
            let len = per.min(n - start);
            let (buf, event) = &mut self.bufs[self.next];
            self.next = (self.next + 1) % 2;
            // This buffer's previous copy has finished reading it.
            event.synchronize()?;
            let bytes = buf.as_mut_slice()?;
            // SAFETY: the page-locked buffer is page aligned (so aligned for T) and T is plain
            // old data (f32, bf16 or f16), so its bytes may be viewed as T values.
            let (head, typed, _) = unsafe { bytes.align_to_mut::<T>() };
            if !head.is_empty() || typed.len() < len {
                return Err(GpuError::Staging("misaligned staging buffer".into()));
            }
            let typed = &mut typed[..len];
            typed
                .par_chunks_mut(TASK)
                .enumerate()
                .for_each(|(i, out)| T::read(src, start + i * TASK, out));
            let mut view = dst.slice.slice_mut(start..start + len);
            // Page-locked source: an asynchronous copy on the compute stream; the event below
            // tells the next use of this buffer when it is free again.
            dev.stream.memcpy_htod(&*typed, &mut view)?;
            event.record(&dev.stream)?;
            start += len;
            self.uploaded += len * std::mem::size_of::<T>();
        }
        Ok(())
    }

    /// Uploads `src` into a new buffer of precision `p`.
    pub fn upload_gemm(
        &mut self,
        dev: &Device,
        p: Precision,
        src: &dyn HostSource,
    ) -> Result<GemmBuffer> {
        Ok(match p {
            Precision::Bf16 => GemmBuffer::Bf16(self.upload(dev, src)?),
            // f16 range: a weight beyond ±65504 becomes an infinity here; the towers' rows are
            // then non-finite and refused (never clamped).
            Precision::F16 => GemmBuffer::F16(self.upload(dev, src)?),
            Precision::F32 => GemmBuffer::F32(self.upload(dev, src)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safetensors_float_spellings_map_to_their_types() {
        assert_eq!(LeDtype::from_safetensors("F32"), Some(LeDtype::F32));
        assert_eq!(LeDtype::from_safetensors("F16"), Some(LeDtype::F16));
        assert_eq!(LeDtype::from_safetensors("BF16"), Some(LeDtype::Bf16));
        for other in ["I64", "U8", "F64", "bf16", ""] {
            assert_eq!(LeDtype::from_safetensors(other), None, "{other}");
        }
    }

    #[test]
    fn le_bytes_read_every_dtype_in_ranges() {
        let vals = [1.0f32, -2.5, 0.15625, 65504.0, 1.0 + 1.0 / 256.0];
        let f32b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let f16b: Vec<u8> = vals
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect();
        let bf16b: Vec<u8> = vals
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect();
        for (bytes, dt) in [
            (&f32b, LeDtype::F32),
            (&f16b, LeDtype::F16),
            (&bf16b, LeDtype::Bf16),
        ] {
            let s = LeBytes::new(bytes, dt).unwrap();
            assert_eq!(s.len(), 5);
            let mut f = [0.0f32; 3];
            s.read_f32(2, &mut f);
            let mut b = [bf16::ZERO; 3];
            s.read_bf16(1, &mut b);
            for (i, &v) in f.iter().enumerate() {
                let want = match dt {
                    LeDtype::F32 => vals[2 + i],
                    LeDtype::F16 => f16::from_f32(vals[2 + i]).to_f32(),
                    LeDtype::Bf16 => bf16::from_f32(vals[2 + i]).to_f32(),
                };
                assert_eq!(v, want, "{dt:?} f32 element {}", 2 + i);
            }
            for (i, &v) in b.iter().enumerate() {
                let want = match dt {
                    LeDtype::F16 => bf16::from_f32(f16::from_f32(vals[1 + i]).to_f32()),
                    _ => bf16::from_f32(vals[1 + i]),
                };
                assert_eq!(v, want, "{dt:?} bf16 element {}", 1 + i);
            }
        }
        assert!(LeBytes::new(&[0u8; 3], LeDtype::F32).is_err());
    }

    #[test]
    fn a_stack_reads_across_its_parts_in_either_precision() {
        let a: Vec<f32> = (0..7).map(|i| i as f32 + 0.5).collect();
        let b: Vec<f32> = (0..5).map(|i| -(i as f32) * 1.25).collect();
        let bb: Vec<u8> = b
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect();
        let t = HostTensor::stack(vec![
            HostTensor::from_f32(a.clone()),
            HostTensor::Stack(vec![]),
            HostTensor::Bytes(LeBytes::new(&bb, LeDtype::Bf16).unwrap()),
            HostTensor::F32(vec![9.0]),
        ]);
        let want: Vec<f32> = a
            .iter()
            .copied()
            .chain(b.iter().map(|v| bf16::from_f32(*v).to_f32()))
            .chain([9.0])
            .collect();
        assert_eq!(t.len(), 13);
        assert_eq!(t.to_f32_vec(), want);
        for start in 0..13 {
            for n in 0..=13 - start {
                let mut f = vec![f32::NAN; n];
                t.read_f32(start, &mut f);
                assert_eq!(f, want[start..start + n], "f32 {start}+{n}");
                let mut h = vec![bf16::NAN; n];
                t.read_bf16(start, &mut h);
                let hw: Vec<bf16> = want[start..start + n]
                    .iter()
                    .map(|v| bf16::from_f32(*v))
                    .collect();
                assert_eq!(h, hw, "bf16 {start}+{n}");
            }
        }
        assert_eq!(
            Vec::<f32>::stack(vec![vec![1.0], vec![2.0, 3.0]]),
            [1.0, 2.0, 3.0]
        );
    }

    /// f16 reads round once to nearest even: f16 bytes are copied as they are, f32 and bf16 bytes
    /// (bf16 → f32 is exact) and f32 values round once, and the trait's default rounds its f32 read;
    /// a stack reads across its parts.
    #[test]
    fn f16_reads_round_once() {
        let vals = [
            0.1f32,
            -2.5,
            65504.0,
            70000.0,
            1e-6,
            -0.0,
            3.0e-8,
            1.0 / 3.0,
        ];
        let want: Vec<f16> = vals.iter().map(|v| f16::from_f32(*v)).collect();
        assert_eq!(want[3], f16::INFINITY, "past f16's range");
        let f32_bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let f16_bytes: Vec<u8> = want.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bf: Vec<bf16> = vals.iter().map(|v| bf16::from_f32(*v)).collect();
        let bf_bytes: Vec<u8> = bf.iter().flat_map(|v| v.to_le_bytes()).collect();
        let read = |src: &dyn HostSource| {
            let mut out = vec![f16::NAN; src.len()];
            src.read_f16(0, &mut out);
            out
        };
        let le = |b: &[u8], d| LeBytes::new(b, d).map(|l| read(&l)).unwrap_or_default();
        assert_eq!(le(&f32_bytes, LeDtype::F32), want);
        assert_eq!(le(&f16_bytes, LeDtype::F16), want);
        let from_bf: Vec<f16> = bf.iter().map(|v| f16::from_f32(v.to_f32())).collect();
        assert_eq!(le(&bf_bytes, LeDtype::Bf16), from_bf);
        assert_eq!(read(&vals.to_vec()), want);
        let stack = HostTensor::Stack(vec![
            HostTensor::Slice(&vals[..3]),
            HostTensor::Bytes(LeBytes::new(&f16_bytes[6..], LeDtype::F16).unwrap()),
        ]);
        let mut part = vec![f16::NAN; 4];
        stack.read_f16(1, &mut part);
        assert_eq!(part, want[1..5]);
        /// i ↦ i / 7 + 1e-3, through the trait's default `read_f16`.
        struct Ramp(usize);
        impl HostSource for Ramp {
            fn len(&self) -> usize {
                self.0
            }
            fn read_f32(&self, start: usize, out: &mut [f32]) {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = (start + i) as f32 / 7.0 + 1e-3;
                }
            }
        }
        let mut out = vec![f16::ZERO; 2500];
        Ramp(5000).read_f16(1234, &mut out);
        for (i, v) in out.iter().enumerate() {
            assert_eq!(*v, f16::from_f32((1234 + i) as f32 / 7.0 + 1e-3));
        }
    }

    #[test]
    fn the_default_bf16_read_rounds_the_f32_read() {
        /// i ↦ i / 7 + 1e-3, through the trait's default `read_bf16`.
        struct Ramp(usize);
        impl HostSource for Ramp {
            fn len(&self) -> usize {
                self.0
            }
            fn read_f32(&self, start: usize, out: &mut [f32]) {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = (start + i) as f32 / 7.0 + 1e-3;
                }
            }
        }
        let r = Ramp(5000);
        let mut out = vec![bf16::ZERO; 2500];
        r.read_bf16(1234, &mut out);
        for (i, v) in out.iter().enumerate() {
            assert_eq!(*v, bf16::from_f32((1234 + i) as f32 / 7.0 + 1e-3));
        }
        let v: Vec<f32> = (0..10).map(|i| i as f32 * 0.3).collect();
        let mut b = [bf16::ZERO; 4];
        v.read_bf16(3, &mut b);
        assert_eq!(
            b.map(bf16::to_f32),
            [0.9f32, 1.2, 1.5, 1.8].map(|x| bf16::from_f32(x).to_f32())
        );
    }
}
