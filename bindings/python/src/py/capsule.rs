//! DLPack capsules: the ones this package hands out, and reading the ones producers hand in.
//!
//! A capsule named `dltensor` (or `dltensor_versioned`) that is never consumed frees its tensor
//! when it dies; a consumer renames the capsule it takes to `used_dltensor`
//! (`used_dltensor_versioned`) and calls the deleter itself when done, so the capsule's
//! destructor must then do nothing (the DLPack Python specification).

use std::ffi::CStr;

use pyo3::ffi;
use pyo3::prelude::*;

use crate::dlpack::{Borrowed, DLManagedTensor, DLManagedTensorVersioned};
use crate::failure::Failure;

const DLTENSOR: &CStr = c"dltensor";
const DLTENSOR_VERSIONED: &CStr = c"dltensor_versioned";

/// Wraps an exported legacy tensor in a `dltensor` capsule; on failure the tensor is freed.
pub fn legacy(py: Python<'_>, p: *mut DLManagedTensor) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY: `p` is a live exported tensor; the name is a static C string, as the capsule keeps
    // the pointer.
    let cap = unsafe { ffi::PyCapsule_New(p.cast(), DLTENSOR.as_ptr(), Some(destroy_legacy)) };
    if cap.is_null() {
        // SAFETY: no capsule owns `p`: free it here, once.
        unsafe {
            if let Some(d) = (*p).deleter {
                d(p)
            }
        }
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyCapsule_New returned a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) })
}

/// Wraps an exported versioned tensor in a `dltensor_versioned` capsule.
pub fn versioned(py: Python<'_>, p: *mut DLManagedTensorVersioned) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY: as in `legacy`.
    let cap = unsafe {
        ffi::PyCapsule_New(
            p.cast(),
            DLTENSOR_VERSIONED.as_ptr(),
            Some(destroy_versioned),
        )
    };
    if cap.is_null() {
        // SAFETY: as in `legacy`.
        unsafe {
            if let Some(d) = (*p).deleter {
                d(p)
            }
        }
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyCapsule_New returned a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) })
}

/// The capsule destructor: frees the tensor unless a consumer took it (renamed the capsule).
unsafe extern "C" fn destroy_legacy(cap: *mut ffi::PyObject) {
    // SAFETY: `cap` is the dying capsule; IsValid and GetPointer with its current name set no
    // exception.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, DLTENSOR.as_ptr()) != 1 {
            return; // consumed: the consumer owns the tensor now
        }
        let p = ffi::PyCapsule_GetPointer(cap, DLTENSOR.as_ptr()).cast::<DLManagedTensor>();
        if !p.is_null() {
            if let Some(d) = (*p).deleter {
                d(p)
            }
        }
    }
}

/// The versioned capsule's destructor (see [`destroy_legacy`]).
unsafe extern "C" fn destroy_versioned(cap: *mut ffi::PyObject) {
    // SAFETY: as in `destroy_legacy`.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, DLTENSOR_VERSIONED.as_ptr()) != 1 {
            return;
        }
        let p = ffi::PyCapsule_GetPointer(cap, DLTENSOR_VERSIONED.as_ptr())
            .cast::<DLManagedTensorVersioned>();
        if !p.is_null() {
            if let Some(d) = (*p).deleter {
                d(p)
            }
        }
    }
}

/// Reads the tensor in a producer's capsule without consuming it: the capsule keeps its name and
/// frees the tensor when it dies, so the fields read are valid only while `cap` lives.
pub fn read(cap: &Bound<'_, PyAny>, what: &str) -> Result<Borrowed, Failure> {
    let ptr = cap.as_ptr();
    // SAFETY: `ptr` is a live object; IsValid accepts any object and sets no exception, and a
    // valid capsule of that name holds the struct DLPack names for it.
    unsafe {
        if ffi::PyCapsule_IsValid(ptr, DLTENSOR_VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(ptr, DLTENSOR_VERSIONED.as_ptr())
                .cast::<DLManagedTensorVersioned>();
            if p.is_null() {
                return Err(Failure::type_error(format!(
                    "{what}: an empty DLPack capsule"
                )));
            }
            if (*p).version.major != 1 {
                return Err(Failure::buffer(format!(
                    "{what}: DLPack version {}.{} (this package reads 1.x)",
                    (*p).version.major,
                    (*p).version.minor
                )));
            }
            Borrowed::read(&(*p).dl_tensor).map_err(|e| Failure::value(format!("{what}: {e}")))
        } else if ffi::PyCapsule_IsValid(ptr, DLTENSOR.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(ptr, DLTENSOR.as_ptr()).cast::<DLManagedTensor>();
            if p.is_null() {
                return Err(Failure::type_error(format!(
                    "{what}: an empty DLPack capsule"
                )));
            }
            Borrowed::read(&(*p).dl_tensor).map_err(|e| Failure::value(format!("{what}: {e}")))
        } else {
            Err(Failure::type_error(format!(
                "{what}: __dlpack__ did not return an unconsumed DLPack capsule"
            )))
        }
    }
}
