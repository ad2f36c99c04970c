//! The C ABI called from Rust in this process (the crate's rlib): the per-thread last error,
//! out-params left alone on failure, and one handle shared by threads.

mod common;

use common::fixtures;
use std::ffi::{CStr, CString};
use vision_towers::vision_prep::ImageSource;
use vision_towers_c::*;

fn last_error() -> String {
    // SAFETY: vt_last_error returns a NUL-terminated string valid until the next call here.
    unsafe { CStr::from_ptr(vt_last_error()) }
        .to_string_lossy()
        .into_owned()
}

struct Handle(*mut vt_model);
// SAFETY: the ABI's promise under test: a `const vt_model*` may be used from several threads.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

impl Handle {
    /// The raw handle (a method, so closures capture the `Sync` wrapper, not the pointer).
    fn ptr(&self) -> *mut vt_model {
        self.0
    }
}

fn open(model: &str) -> Handle {
    let path = CString::new(fixtures().join(model).to_str().unwrap()).unwrap();
    let mut o = vt_open_options_default();
    o.device = c"cpu".as_ptr();
    let mut m = std::ptr::null_mut();
    // SAFETY: valid path, options and out-param.
    let s = unsafe { vt_model_open(path.as_ptr(), &o, &mut m) };
    assert_eq!(s, vt_status::VT_OK, "{}", last_error());
    Handle(m)
}

fn image(b: &[u8]) -> vt_image {
    vt_image {
        data: b.as_ptr(),
        len: b.len(),
        kind: vt_image_kind::VT_IMAGE_BYTES as u32,
    }
}

#[test]
fn each_thread_reads_its_own_last_error() {
    let h = open("models/glm_ocr");
    let good = std::fs::read(fixtures().join("images/tiny_20x15.png")).unwrap();
    let bad = b"not an image at all".to_vec();
    let barrier = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let failing = s.spawn(|| {
            let mut p = std::ptr::null_mut();
            // SAFETY: live handle, valid image and out-param.
            let st = unsafe { vt_model_plan(h.ptr(), &image(&bad), &mut p) };
            barrier.wait(); // the other thread succeeds now
            barrier.wait();
            (st, p.is_null(), last_error(), vt_last_error_image())
        });
        barrier.wait();
        let mut p = std::ptr::null_mut();
        // SAFETY: as above.
        let st = unsafe { vt_model_plan(h.0, &image(&good), &mut p) };
        assert_eq!(st, vt_status::VT_OK);
        assert_eq!(last_error(), "");
        assert_eq!(vt_last_error_image(), -1);
        // SAFETY: a plan from vt_model_plan, freed once.
        unsafe { vt_plan_free(p) };
        barrier.wait();
        let (st, untouched, message, index) = failing.join().unwrap();
        assert_eq!(st, vt_status::VT_ERR_IMAGE);
        assert!(untouched, "the out-param was written on failure");
        // SAFETY: a live handle.
        let m = unsafe { model_of(h.0) }.unwrap();
        let want = m.plan(ImageSource::Bytes(&bad)).unwrap_err().to_string();
        assert_eq!(message, want);
        assert_eq!(index, 0);
    });
    // SAFETY: the handle, freed once.
    unsafe { vt_model_free(h.0) };
}

#[test]
fn the_refused_image_is_named_by_its_index() {
    let h = open("models/glm_ocr");
    let good = std::fs::read(fixtures().join("images/tiny_20x15.png")).unwrap();
    let bomb =
        std::fs::read(fixtures().join("adversarial/images/bomb_png_100000x100000.png")).unwrap();
    let images = [image(&good), image(&good), image(&bomb)];
    let mut rows = std::ptr::null_mut();
    // SAFETY: live handle, three valid images, a valid out-param.
    let st = unsafe { vt_model_encode(h.0, images.as_ptr(), 3, &mut rows) };
    assert_eq!(st, vt_status::VT_ERR_IMAGE_TOO_LARGE, "{}", last_error());
    assert!(rows.is_null());
    assert_eq!(vt_last_error_image(), 2);
    assert!(last_error().starts_with("image 2: "), "{}", last_error());
    // SAFETY: the handle, freed once.
    unsafe { vt_model_free(h.0) };
}

#[test]
fn threads_share_one_handle_and_get_the_rust_apis_rows() {
    let h = open("models/glm5_next");
    // SAFETY: a live handle.
    let m = unsafe { model_of(h.0) }.unwrap();
    let names = [
        "tiny_20x15.png",
        "logo_rgba_112x84.png",
        "coffee_144x96.jpg",
    ];
    let bytes: Vec<Vec<u8>> = names
        .iter()
        .map(|n| std::fs::read(fixtures().join("images").join(n)).unwrap())
        .collect();
    let want: Vec<Vec<u32>> = bytes
        .iter()
        .map(|b| {
            m.encode(&[ImageSource::Bytes(b)]).unwrap()[0]
                .rows
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect();
    std::thread::scope(|s| {
        let h = &h;
        let handles: Vec<_> = (0..6)
            .map(|t| {
                let b = &bytes[t % bytes.len()];
                s.spawn(move || {
                    let img = image(b);
                    let mut rows = std::ptr::null_mut();
                    // SAFETY: live handle shared read-only, a valid image and out-param.
                    let st = unsafe { vt_model_encode(h.ptr(), &img, 1, &mut rows) };
                    assert_eq!(st, vt_status::VT_OK, "{}", last_error());
                    // SAFETY: rows from vt_model_encode, read then freed once.
                    let got = unsafe {
                        let n = vt_rows_count(rows) * vt_rows_width(rows);
                        let v: Vec<u32> = std::slice::from_raw_parts(vt_rows_data(rows), n)
                            .iter()
                            .map(|v| v.to_bits())
                            .collect();
                        vt_rows_free(rows);
                        v
                    };
                    (t, got)
                })
            })
            .collect();
        for j in handles {
            let (t, got) = j.join().unwrap();
            assert!(got == want[t % want.len()], "thread {t}: rows differ");
        }
    });
    // SAFETY: the handle, freed once, after every thread returned.
    unsafe { vt_model_free(h.0) };
}
