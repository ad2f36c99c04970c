//! Large zeroed buffers whose pages arrive 2 MiB at a time.
//!
//! A large allocation is fresh memory from the kernel, so its first write costs a page fault per
//! 4 KiB page: a 36 MB decoded photo or a 50 MB glm tensor takes 9 000–12 000 faults, which was a
//! quarter of glm's prepare time on the development VM. On Linux the interior of such a buffer is
//! marked for transparent huge pages before the first write (`madvise(MADV_HUGEPAGE)`); the advice
//! is a hint, changes no contents, and is simply ignored where THP is off.

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

#[cfg(test)]
mod tests {
    #[test]
    fn zeroed_is_zero_at_every_size() {
        for n in [0, 1, 4095, (4 << 20) + 3, 9 << 20] {
            let v = super::zeroed::<f32>(n);
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|&x| x == 0.0));
        }
    }
}
