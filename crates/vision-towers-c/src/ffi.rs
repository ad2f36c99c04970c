//! Checked reads of the caller's pointer arguments and writes of its out-params.

use std::ffi::{c_char, CStr};

use crate::error::Failure;

/// The NUL-terminated string at `p`.
///
/// # Safety
/// `p` is NULL or points at a NUL-terminated string that lives for `'a`.
pub(crate) unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a CStr, Failure> {
    if p.is_null() {
        return Err(Failure::null(what));
    }
    // SAFETY: non-NULL and, by the caller's contract, NUL-terminated and alive for 'a.
    Ok(unsafe { CStr::from_ptr(p) })
}

/// The UTF-8 string at `p`.
///
/// # Safety
/// As [`c_str`].
pub(crate) unsafe fn utf8<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    // SAFETY: the caller's contract, passed on.
    let s = unsafe { c_str(p, what) }?;
    s.to_str()
        .map_err(|_| Failure::invalid(format!("{what} is not valid UTF-8")))
}

/// `len` values of `T` at `p`: NULL is allowed only with `len == 0` (an empty slice); the
/// pointer must be aligned and the bytes must not pass `isize::MAX`.
///
/// # Safety
/// A non-NULL `p` points at `len` initialised values of `T` that live, unmodified, for `'a`.
pub(crate) unsafe fn slice<'a, T>(p: *const T, len: usize, what: &str) -> Result<&'a [T], Failure> {
    if p.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(Failure::null(what))
        };
    }
    check_extent::<T>(p as usize, len, what)?;
    // SAFETY: non-NULL, aligned, at most isize::MAX bytes, and by the caller's contract `len`
    // initialised values alive for 'a.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// `len` writable values of `T` at `p` (NULL only with `len == 0`).
///
/// # Safety
/// A non-NULL `p` points at `len` values of `T` the caller lets the library write, not read or
/// written by anything else during the call.
pub(crate) unsafe fn slice_mut<'a, T>(
    p: *mut T,
    len: usize,
    what: &str,
) -> Result<&'a mut [T], Failure> {
    if p.is_null() {
        return if len == 0 {
            Ok(&mut [])
        } else {
            Err(Failure::null(what))
        };
    }
    check_extent::<T>(p as usize, len, what)?;
    // SAFETY: as in `slice`, and the caller grants exclusive access for the call.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

/// Alignment and size rules of a slice at `addr`.
pub(crate) fn check_extent<T>(addr: usize, len: usize, what: &str) -> Result<(), Failure> {
    if !addr.is_multiple_of(std::mem::align_of::<T>()) {
        return Err(Failure::invalid(format!(
            "{what} is not aligned to {} bytes",
            std::mem::align_of::<T>()
        )));
    }
    match len.checked_mul(std::mem::size_of::<T>()) {
        Some(b) if b <= isize::MAX as usize && addr.checked_add(b).is_some() => Ok(()),
        _ => Err(Failure::invalid(format!(
            "{what}: {len} elements run past the address space"
        ))),
    }
}

/// Writes `value` to the out-param `out` if it is not NULL.
///
/// # Safety
/// A non-NULL `out` is valid for a write of `T` and aligned.
pub(crate) unsafe fn write_opt<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: the caller's contract.
        unsafe { out.write(value) };
    }
}

/// Checks that the required out-param `out` is not NULL.
pub(crate) fn need_out<T>(out: *mut T, what: &str) -> Result<(), Failure> {
    if out.is_null() {
        Err(Failure::null(what))
    } else if !(out as usize).is_multiple_of(std::mem::align_of::<T>()) {
        Err(Failure::invalid(format!("{what} is not aligned")))
    } else {
        Ok(())
    }
}
