//! Status codes, the per-thread last error, and the guard every entry point runs under.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use vision_towers::tower_core::{Classify, ErrorKind};
use vision_towers::ModelError;

/// What a call gave. `VT_OK` is 0; every other value is a refusal whose message
/// [`vt_last_error`] holds.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum vt_status {
    /// Success.
    VT_OK = 0,
    /// A required pointer argument was NULL.
    VT_ERR_NULL_ARGUMENT = 1,
    /// An argument out of its range: an unknown enum value or device name, a path or name that
    /// is not valid, a length with a NULL pointer, an unaligned pointer, a shape its values do
    /// not fill, no images, a model setting out of range (e.g. `max_soft_tokens` not one of
    /// 70, 140, 280, 560, 1120).
    VT_ERR_INVALID_ARGUMENT = 2,
    /// The caller's buffer is too small; `*needed` says how many elements it must hold.
    VT_ERR_BUFFER_TOO_SMALL = 3,
    /// A file could not be read (missing, unreadable, a directory without a checkpoint).
    VT_ERR_IO = 4,
    /// The weight file or its configs were refused when opening: not GGUF or safetensors,
    /// malformed, a family not supported, a missing or misshapen tensor, a config value out of
    /// range.
    VT_ERR_MODEL = 5,
    /// An image was refused: not an image, a format not decoded, zero-sized, corrupt or
    /// truncated, a malformed data URI, a URI scheme other than `data:`, or a size the model's
    /// processor cannot plan. [`vt_last_error_image`] names it. For a video: frames that do not
    /// fit its metadata (no fps for glm5_next, too few frames, frames of different sizes, a short
    /// raw frame), or a sampled frame refused as an image (`vt_last_error_image` names the frame).
    VT_ERR_IMAGE = 6,
    /// An image is over a limit: the decode budget (`max_pixels`), the data URI cap, the output
    /// budget, or more patches than one pass holds (`max_patches_per_pass`).
    /// [`vt_last_error_image`] names it. For a video: over a metadata budget (4096 frames, 2^28
    /// pixels of the sampled frames, 1 GiB handed in), checked before any frame is read.
    VT_ERR_IMAGE_TOO_LARGE = 7,
    /// Prepared tensors were refused by the tower (missing or mistyped tensor, a shape that
    /// does not fit the model, an inconsistent grid or count).
    VT_ERR_INPUT = 8,
    /// A CUDA device was asked for and none opens.
    VT_ERR_NO_DEVICE = 9,
    /// The request is valid but not available: bf16 or f16 on the CPU, device rows from a model on the
    /// CPU, 16-bit rows from a model of another precision, video for a family without a video path (step3p7,
    /// glm_ocr).
    VT_ERR_UNSUPPORTED = 10,
    /// The device ran out of memory; the model stays usable (retry with fewer images per call or
    /// a lower `max_patches_per_pass`).
    VT_ERR_OUT_OF_MEMORY = 11,
    /// Any other CUDA failure (driver, launch, cuBLASLt).
    VT_ERR_DEVICE = 12,
    /// A broken promise inside the library (e.g. the tower gave another row count than the
    /// plan): a bug, please report it.
    VT_ERR_INTERNAL = 13,
    /// A Rust panic was caught at the boundary: a bug, please report it. The message says where.
    VT_ERR_PANIC = 14,
}

use vt_status::*;

/// A refusal on its way to the caller: status, message, and the image it is about.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: vt_status,
    pub(crate) message: String,
    pub(crate) image: Option<usize>,
}

impl Failure {
    pub(crate) fn new(status: vt_status, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
            image: None,
        }
    }

    pub(crate) fn null(what: &str) -> Failure {
        Failure::new(VT_ERR_NULL_ARGUMENT, format!("{what} is NULL"))
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(VT_ERR_INVALID_ARGUMENT, message)
    }
}

/// The status of each kind of failure, one to one: the library's errors state their own kind
/// ([`Classify`]), so no call here guesses it from what the call was doing.
pub(crate) fn status_of(kind: ErrorKind) -> vt_status {
    match kind {
        ErrorKind::Setting => VT_ERR_INVALID_ARGUMENT,
        ErrorKind::Io => VT_ERR_IO,
        ErrorKind::Weights => VT_ERR_MODEL,
        ErrorKind::Image => VT_ERR_IMAGE,
        ErrorKind::ImageTooLarge => VT_ERR_IMAGE_TOO_LARGE,
        ErrorKind::Input => VT_ERR_INPUT,
        ErrorKind::NoDevice => VT_ERR_NO_DEVICE,
        ErrorKind::Unsupported => VT_ERR_UNSUPPORTED,
        ErrorKind::OutOfMemory => VT_ERR_OUT_OF_MEMORY,
        ErrorKind::Device => VT_ERR_DEVICE,
        ErrorKind::Internal => VT_ERR_INTERNAL,
    }
}

/// A `Model` error as a refusal: the status of its kind, its own message (`Display`), the image
/// it names.
pub(crate) fn model_failure(e: &ModelError) -> Failure {
    Failure {
        status: status_of(e.kind()),
        message: e.to_string(),
        image: e.image_index(),
    }
}

impl From<ModelError> for Failure {
    /// An error of an encode (or plan) call.
    fn from(e: ModelError) -> Failure {
        model_failure(&e)
    }
}

/// The last status-returning call's message and image on this thread.
struct LastError {
    message: CString,
    image: i64,
}

thread_local! {
    static LAST: RefCell<LastError> = RefCell::new(LastError {
        message: CString::default(),
        image: -1,
    });
}

fn c_message(s: &str) -> CString {
    // An interior NUL (a hostile tensor name, say) would cut the message: show it instead.
    CString::new(s.replace('\0', "\\0")).unwrap_or_default()
}

fn set_last(message: &str, image: Option<usize>) {
    let _ = LAST.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            l.message = c_message(message);
            l.image = image.map_or(-1, |i| i64::try_from(i).unwrap_or(i64::MAX));
        }
    });
}

/// The payload of a caught panic as text.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic with a non-string payload".into())
}

/// Runs an entry point's body: a panic becomes `VT_ERR_PANIC`, a refusal its status; either way
/// (and `VT_OK`, which clears it) the thread's last error is set.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), Failure>) -> vt_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            set_last("", None);
            VT_OK
        }
        Ok(Err(fail)) => {
            set_last(&fail.message, fail.image);
            fail.status
        }
        Err(p) => {
            set_last(
                &format!(
                    "a Rust panic was caught at the C boundary (a bug in vision-towers, please \
                     report it): {}",
                    panic_text(&*p)
                ),
                None,
            );
            VT_ERR_PANIC
        }
    }
}

/// Runs a getter's body: a panic gives `fallback`; the last error is left as it is.
pub(crate) fn guard_value<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// The message of the last status-returning call on this thread: empty after `VT_OK`, never
/// NULL. Valid until the next `vt_` call on the same thread; copy it to keep it.
#[no_mangle]
pub extern "C" fn vt_last_error() -> *const c_char {
    guard_value(c"".as_ptr(), || {
        LAST.try_with(|l| match l.try_borrow() {
            Ok(l) => l.message.as_ptr(),
            Err(_) => c"".as_ptr(),
        })
        .unwrap_or(c"".as_ptr())
    })
}

/// The position (in the call's image array) of the image the last refusal on this thread is
/// about, or -1 when it is about none (or the last call succeeded).
#[no_mangle]
pub extern "C" fn vt_last_error_image() -> i64 {
    guard_value(-1, || {
        LAST.try_with(|l| l.try_borrow().map_or(-1, |l| l.image))
            .unwrap_or(-1)
    })
}

/// The name of a status (`"VT_ERR_IMAGE"`), a static string; `"VT_UNKNOWN_STATUS"` for a value
/// that is not one. Never fails.
#[no_mangle]
pub extern "C" fn vt_status_name(status: u32) -> *const c_char {
    let name: &'static std::ffi::CStr = match status {
        0 => c"VT_OK",
        1 => c"VT_ERR_NULL_ARGUMENT",
        2 => c"VT_ERR_INVALID_ARGUMENT",
        3 => c"VT_ERR_BUFFER_TOO_SMALL",
        4 => c"VT_ERR_IO",
        5 => c"VT_ERR_MODEL",
        6 => c"VT_ERR_IMAGE",
        7 => c"VT_ERR_IMAGE_TOO_LARGE",
        8 => c"VT_ERR_INPUT",
        9 => c"VT_ERR_NO_DEVICE",
        10 => c"VT_ERR_UNSUPPORTED",
        11 => c"VT_ERR_OUT_OF_MEMORY",
        12 => c"VT_ERR_DEVICE",
        13 => c"VT_ERR_INTERNAL",
        14 => c"VT_ERR_PANIC",
        _ => c"VT_UNKNOWN_STATUS",
    };
    name.as_ptr()
}

/// Testing only (not in the header): panics inside the guard, so a test sees `VT_ERR_PANIC`
/// and the message come back instead of an abort.
#[no_mangle]
pub extern "C" fn vt_testing_panic() -> vt_status {
    guard(|| panic!("vt_testing_panic: a deliberate panic"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind has its own status (the header documents one per kind), and the library's
    /// weights and input refusals land on VT_ERR_MODEL and VT_ERR_INPUT.
    #[test]
    fn every_kind_has_its_own_status() {
        let statuses: std::collections::HashSet<_> = ErrorKind::ALL
            .iter()
            .map(|&k| status_of(k) as i32)
            .collect();
        assert_eq!(statuses.len(), ErrorKind::ALL.len());
        assert_eq!(status_of(ErrorKind::Weights), VT_ERR_MODEL);
        assert_eq!(status_of(ErrorKind::Input), VT_ERR_INPUT);
        assert!(!statuses.contains(&(VT_OK as i32)));
    }
}
