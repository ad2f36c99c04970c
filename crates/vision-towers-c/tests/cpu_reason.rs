//! The C ABI's side of "nothing silent": where a CUDA device exists but cannot run the tower,
//! `"auto"` opens on the CPU and `vt_model_cpu_reason` says why (NULL where nothing needs
//! saying), `vt_model_gpu_tier` is NULL on the CPU, and a named `"cuda:0"` fails with
//! `VT_ERR_NO_DEVICE` and the same reason in `vt_last_error`. gpu-core's `GPU_CORE_FAKE_DEVICE`
//! stands in for a compute capability 7.0 card; its own test binary, as the variable is
//! process-wide.

mod common;

use common::fixtures;
use std::ffi::{CStr, CString};
use vision_towers_c::*;

fn last_error() -> String {
    // SAFETY: vt_last_error returns a NUL-terminated string valid until the next call here.
    unsafe { CStr::from_ptr(vt_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn open(device: &CStr) -> (vt_status, *mut vt_model) {
    let path = CString::new(fixtures().join("models/gemma4").to_str().unwrap()).unwrap();
    let mut o = vt_open_options_default();
    o.device = device.as_ptr();
    let mut m = std::ptr::null_mut();
    // SAFETY: valid path, options and out-param.
    let s = unsafe { vt_model_open(path.as_ptr(), &o, &mut m) };
    (s, m)
}

/// The string a getter returned, or None for NULL.
fn text(p: *const std::ffi::c_char) -> Option<String> {
    // SAFETY: the getters return NULL or a NUL-terminated string owned by the live model.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

#[test]
fn the_reason_auto_ran_on_the_cpu_has_a_getter() {
    // SAFETY (of the process): this binary's only test sets the variable before any thread reads it.
    std::env::set_var(vision_towers::FAKE_DEVICE_ENV, "7.0");
    let (s, m) = open(c"auto");
    assert_eq!(s, vt_status::VT_OK, "{}", last_error());
    // SAFETY: a live handle.
    let (ordinal, reason, tier) = unsafe {
        (
            vt_model_device_ordinal(m),
            text(vt_model_cpu_reason(m)),
            text(vt_model_gpu_tier(m)),
        )
    };
    assert_eq!(ordinal, -1);
    let reason = reason.expect("a reason");
    assert!(
        reason.contains("7.0") && reason.contains("Volta"),
        "{reason}"
    );
    assert_eq!(tier, None);
    // SAFETY: a live handle, freed once.
    unsafe { vt_model_free(m) };

    let (s, m) = open(c"cpu");
    assert_eq!(s, vt_status::VT_OK, "{}", last_error());
    // SAFETY: a live handle, then freed once; NULL handles are allowed.
    unsafe {
        assert_eq!(text(vt_model_cpu_reason(m)), None);
        vt_model_free(m);
        assert!(vt_model_cpu_reason(std::ptr::null()).is_null());
        assert!(vt_model_gpu_tier(std::ptr::null()).is_null());
    }

    let (s, m) = open(c"cuda:0");
    assert_eq!(s, vt_status::VT_ERR_NO_DEVICE);
    assert!(m.is_null());
    assert!(
        last_error().contains(&reason),
        "{} vs {reason}",
        last_error()
    );
}
