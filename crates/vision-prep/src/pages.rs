//! Large zeroed buffers whose pages arrive 2 MiB at a time.
//!
//! A large allocation is fresh memory from the kernel, so its first write costs a page fault per
//! 4 KiB page: a 36 MB decoded photo or a 50 MB glm tensor takes 9 000–12 000 faults, which was a
//! quarter of glm's prepare time on the development VM. On Linux the interior of such a buffer is
//! marked for transparent huge pages before the first write (`madvise(MADV_HUGEPAGE)`); the advice
//! is a hint, changes no contents, and is simply ignored where THP is off. Buffers kept between
//! calls ([`Scratch`]) avoid the faults altogether: the intermediates always, the output tensors
//! when the caller hands them back (`Preprocessor::recycle`).

/// Copy `src` into `dst` (same length) with non-temporal stores: the f32 output tensors are tens
/// of MB written once and read later by someone else, so they skip the cache and the line reads a
/// normal store makes first (50 MB: 2.4 ms instead of 4.7–5.6 ms on the development VM, one
/// thread). `x86_64` only (SSE, part of its baseline); elsewhere a plain copy. Call
/// [`stream_fence`] before the data is handed to another thread.
pub(crate) fn stream_copy(dst: &mut [f32], src: &[f32]) {
    let n = dst.len().min(src.len());
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
        // Floats before the first 16-byte boundary of `dst`, then 4 at a time, then the tail.
        let head = (dst.as_ptr().align_offset(16)).min(n);
        dst[..head].copy_from_slice(&src[..head]);
        let body = (n - head) / 4 * 4;
        let (d, s) = (dst[head..].as_mut_ptr(), src[head..].as_ptr());
        for i in (0..body).step_by(4) {
            // SAFETY: `i + 4 ≤ body ≤ n − head` keeps both 16-byte accesses inside the slices;
            // `d + i` is 16-byte aligned (`head` reached the boundary, `i` steps by 16 bytes).
            unsafe { _mm_stream_ps(d.add(i), _mm_loadu_ps(s.add(i))) };
        }
        dst[head + body..n].copy_from_slice(&src[head + body..n]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst[..n].copy_from_slice(&src[..n]);
}

/// Order this thread's [`stream_copy`] stores before whatever it does next (`sfence`).
pub(crate) fn stream_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no preconditions (SSE is part of the x86_64 baseline).
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Buffers from this many bytes on get the advice (smaller ones hold no whole 2 MiB page anyway).
const HUGE_PAGE: usize = 2 << 20;

/// `vec![T::default(); n]` for plain numbers, advised for huge pages when large.
pub(crate) fn zeroed<T: Copy + Default>(n: usize) -> Vec<T> {
    let v = vec![T::default(); n];
    advise_huge(v.as_ptr() as usize, n * std::mem::size_of::<T>());
    v
}

#[cfg(target_os = "linux")]
fn advise_huge(addr: usize, bytes: usize) {
    if bytes < 2 * HUGE_PAGE {
        return;
    }
    let start = addr.div_ceil(HUGE_PAGE) * HUGE_PAGE;
    let end = (addr + bytes) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: [start, end) lies inside one live allocation and is page-aligned; MADV_HUGEPAGE
        // only sets a flag on the mapping and never changes memory contents; a failure is harmless,
        // so the result is ignored.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_addr: usize, _bytes: usize) {}

/// Buffers kept between calls, so a steady stream of images stops paying fresh-page faults for
/// them: byte buffers for the intermediates of preprocessing (the decoded image, resize passes,
/// views), and f32 buffers for output tensors a caller handed back. Owned by a `Preprocessor` and
/// shared by its clones and threads; holds at most `cap` bytes.
///
/// A taken buffer's contents are unspecified (left from an earlier image): every user overwrites
/// every value before reading one.
pub(crate) struct Scratch<T = u8> {
    bufs: std::sync::Mutex<Vec<Vec<T>>>,
    cap: usize,
    /// Values written to lengthen kept buffers (a serial fill on the taker's thread).
    #[cfg(test)]
    lengthened: std::sync::atomic::AtomicUsize,
}

/// The scratch of callers without one: takes allocate, gives drop.
static NO_SCRATCH: Scratch = Scratch::new(0);
/// The output pool of callers without one.
static NO_OUTPUTS: Scratch<f32> = Scratch::new(0);

impl Scratch {
    /// The scratch that keeps nothing.
    pub(crate) fn none() -> &'static Scratch {
        &NO_SCRATCH
    }
}

/// The output pool that keeps nothing.
pub(crate) fn no_outputs() -> &'static Scratch<f32> {
    &NO_OUTPUTS
}

impl<T: Copy + Default> Scratch<T> {
    /// A scratch that keeps at most `cap` bytes (0: keeps nothing).
    pub(crate) const fn new(cap: usize) -> Scratch<T> {
        Scratch {
            bufs: std::sync::Mutex::new(Vec::new()),
            cap,
            #[cfg(test)]
            lengthened: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn bufs(&self) -> std::sync::MutexGuard<'_, Vec<Vec<T>>> {
        // A panic elsewhere while holding the lock leaves only whole buffers behind: keep using it.
        self.bufs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bytes_of(v: &Vec<T>) -> usize {
        v.capacity().saturating_mul(std::mem::size_of::<T>())
    }

    /// The smallest kept buffer with room for `n` values, if any; with `filled`, one already
    /// holding `n` values is preferred (no fill to lengthen it).
    fn find(&self, n: usize, filled: bool) -> Option<Vec<T>> {
        if self.cap == 0 {
            return None;
        }
        let mut bufs = self.bufs();
        let smallest = |room: &dyn Fn(&Vec<T>) -> bool| {
            bufs.iter()
                .enumerate()
                .filter(|(_, b)| room(b))
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i)
        };
        let best = filled
            .then(|| smallest(&|b| b.len() >= n))
            .flatten()
            .or_else(|| smallest(&|b| b.capacity() >= n));
        best.map(|i| bufs.swap_remove(i))
    }

    /// A buffer of `n` values with unspecified contents: the smallest kept one that fits, else a
    /// fresh [`zeroed`] one.
    pub(crate) fn take(&self, n: usize) -> Vec<T> {
        self.take_kept(n).0
    }

    /// [`take`](Self::take), and whether the buffer is a kept one (its pages already mapped).
    pub(crate) fn take_kept(&self, n: usize) -> (Vec<T>, bool) {
        match self.find(n, true) {
            Some(mut v) => {
                if v.len() >= n {
                    v.truncate(n);
                } else {
                    #[cfg(test)]
                    self.lengthened
                        .fetch_add(n - v.len(), std::sync::atomic::Ordering::Relaxed);
                    v.resize(n, T::default());
                }
                (v, true)
            }
            None => (zeroed(n), false),
        }
    }

    /// Keep `v` for a later take; the oldest buffers go when over the cap.
    pub(crate) fn give(&self, v: Vec<T>) {
        let bytes = Self::bytes_of(&v);
        if self.cap == 0 || bytes == 0 || bytes > self.cap {
            return;
        }
        let mut bufs = self.bufs();
        bufs.push(v);
        let mut total: usize = bufs.iter().map(Self::bytes_of).sum();
        while total > self.cap {
            total -= Self::bytes_of(&bufs.remove(0));
        }
    }

    /// Values written so far to lengthen kept buffers.
    #[cfg(test)]
    pub(crate) fn lengthened(&self) -> usize {
        self.lengthened.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes held now (capacities).
    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        self.bufs().iter().map(Self::bytes_of).sum()
    }
}

impl<T: Copy + Default> std::fmt::Debug for Scratch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bufs = self.bufs();
        f.debug_struct("Scratch")
            .field("buffers", &bufs.len())
            .field("bytes", &bufs.iter().map(Self::bytes_of).sum::<usize>())
            .field("cap", &self.cap)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::Scratch;

    #[test]
    fn scratch_reuses_within_its_cap() {
        let s = Scratch::new(10 << 20);
        let a = s.take(4 << 20);
        let ptr = a.as_ptr();
        s.give(a);
        let b = s.take(3 << 20);
        assert_eq!(
            (b.as_ptr(), b.len()),
            (ptr, 3 << 20),
            "the kept buffer is reused"
        );
        s.give(b);
        // Over the cap: the oldest goes.
        s.give(vec![0u8; 8 << 20]);
        assert!(format!("{s:?}").contains("buffers: 1"), "{s:?}");
        // Nothing kept without a cap.
        let none = Scratch::none();
        none.give(vec![1u8; 16]);
        assert_eq!(none.take(16), vec![0u8; 16]);
    }

    /// `take` prefers a kept buffer already holding the values it asks for over a smaller-capacity
    /// one it would have to fill out.
    #[test]
    fn take_prefers_a_filled_buffer() {
        let s = Scratch::new(64 << 20);
        let mut big = Vec::with_capacity(8 << 20);
        big.resize(6 << 20, 1u8);
        let mut short = Vec::with_capacity(5 << 20);
        short.resize(1 << 20, 2u8);
        let (pb, ps) = (big.as_ptr(), short.as_ptr());
        s.give(big);
        s.give(short);
        let a = s.take(4 << 20);
        assert_eq!((a.as_ptr(), a.len()), (pb, 4 << 20));
        assert!(a.iter().all(|&x| x == 1), "the filled buffer, truncated");
        s.give(a);
        // None filled far enough: the smallest with room, lengthened.
        let c = s.take(5 << 20);
        assert_eq!((c.as_ptr(), c.len()), (ps, 5 << 20));
        assert!(
            c[..1 << 20].iter().all(|&x| x == 2),
            "the short buffer's values kept"
        );
    }

    #[test]
    fn output_buffers_come_back_sized() {
        let s = Scratch::<f32>::new(16 << 20);
        let a = s.take(1 << 20);
        assert_eq!(a.len(), 1 << 20);
        let ptr = a.as_ptr();
        s.give(a);
        // Larger than needed: reused, sized to the request.
        let b = s.take(1000);
        assert_eq!((b.as_ptr(), b.len()), (ptr, 1000));
        s.give(b);
        // Smaller than needed: not reused, and still kept.
        let c = s.take(2 << 20);
        assert!(c.as_ptr() != ptr && c.len() == 2 << 20);
        assert_eq!(s.held_bytes(), 4 << 20);
        // The bound counts bytes, not values: two 4 MiB buffers and a 12 MiB one do not fit in 16.
        s.give(c);
        s.give(vec![0f32; 3 << 20]);
        assert!(s.held_bytes() <= 16 << 20, "{s:?}");
        assert_eq!(s.held_bytes(), 12 << 20, "{s:?}");
    }

    /// Every length and alignment offset copies exactly, head, body and tail.
    #[test]
    fn stream_copy_copies() {
        let src: Vec<f32> = (0..300).map(|i| i as f32 * 0.5 - 7.0).collect();
        let mut buf = vec![f32::NAN; 310];
        for off in 0..5 {
            for n in [0, 1, 3, 4, 5, 17, 64, 299] {
                buf.fill(f32::NAN);
                super::stream_copy(&mut buf[off..off + n], &src[..n]);
                super::stream_fence();
                assert_eq!(&buf[off..off + n], &src[..n], "off {off} n {n}");
                assert!(buf[..off].iter().chain(&buf[off + n..]).all(|v| v.is_nan()));
            }
        }
    }

    #[test]
    fn zeroed_is_zero_at_every_size() {
        for n in [0, 1, 4095, (4 << 20) + 3, 9 << 20] {
            let v = super::zeroed::<f32>(n);
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|&x| x == 0.0));
        }
    }
}
