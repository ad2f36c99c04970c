//! The C ABI's device path on a CUDA machine (`#[ignore = "needs a CUDA device"]`, run by
//! `cargo xtask gpu-test`; on a machine without cargo see `.device/capi/run.sh`, written by
//! `cargo xtask gpu-test --prepare`).
//!
//! - In this process (the crate's rlib): `vt_model_encode_device` and
//!   `vt_model_encode_tensors_device` write into a caller's `cuMemAlloc`'d buffer on a caller's
//!   stream exactly the bytes `Model::encode_device` / `encode_tensors_device` give on the very
//!   same model (f32 and bf16); out of memory is `VT_ERR_OUT_OF_MEMORY` and the handle stays
//!   usable. `vt_model_encode_video_device` does the same for the upstream video tower cases the
//!   CPU video tests use (bitwise `Model::encode_video_device`'s, the plan
//!   `vt_model_plan_video`'s, f32 rows within 1e-4 rel-L2 of upstream's f64 rows), and refuses a
//!   short buffer from the frames' headers before anything is decoded or written.
//! - Through the C program (`vt_ctest`, CUDA through `dlopen("libcuda.so.1")`): the f32 device
//!   rows are bitwise the rows `vt_model_encode` downloads from the same handle, bf16 within one
//!   bf16 step of them, a short buffer is refused before anything runs, an f32 model refuses
//!   bf16 rows, and out of memory leaves the handle usable. Across processes the tuned GEMM
//!   algorithms may differ (each process times its own), so the Rust API's rows are compared
//!   there within the bf16 bound and reported, not bitwise.

mod common;

use common::*;
use std::ffi::{c_void, CString};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use vision_towers::gpu_core::{self, GpuError};
use vision_towers::tower_core::rel_l2;
use vision_towers::vision_prep::{ImageSource, Video, VideoFrames};
use vision_towers::{Model, Precision, RowsDtype};
use vision_towers_c::*;

const IMAGES: [&str; 4] = [
    "coffee_144x96.jpg",
    "tiny_20x15.png",
    "logo_rgba_112x84.png",
    "chelsea_168x112.webp",
];

const MODELS: [&str; 5] = [
    "models/gemma4",
    "models/gemma4_gguf/mmproj-BF16.gguf",
    "models/glm5_next",
    "models/glm_ocr",
    "models/step3p7",
];

/// (model, a tower fixture holding the upstream processor's tensors).
const TENSOR_CASES: [(&str, &str); 4] = [
    ("models/gemma4", "gemma4/batch2"),
    ("models/glm5_next", "glm5_next/batch2"),
    ("models/glm_ocr", "glm_ocr/batch2"),
    ("models/step3p7", "step3p7/batch2"),
];

fn image_bytes() -> Vec<Vec<u8>> {
    IMAGES
        .iter()
        .map(|i| std::fs::read(fixtures().join("images").join(i)).unwrap())
        .collect()
}

/// The 16-bit rows of a tower in `p`, as the C ABI names their dtype (`vt_dtype`): f16 for an f16
/// tower, else bf16 (an f32 tower's 16-bit rows: refused, checked by the callers).
fn half_of(p: Precision) -> (u32, RowsDtype) {
    match p {
        Precision::F16 => (2, RowsDtype::F16),
        _ => (1, RowsDtype::Bf16),
    }
}

/// The 16-bit rows a model opened with no precision gives on this device, as the C ABI names them:
/// (`vt_dtype`, the dtype, `vt_precision` as text). bf16 from 8.0, f16 on a tier without bf16
/// tensor cores (7.5, native or forced: `GPU_CORE_FORCE_TIER`).
fn default_half() -> (u32, RowsDtype, &'static str) {
    let dev = gpu_core::Device::new(0).expect("this test needs a CUDA device");
    let (code, dtype) = half_of(dev.default_precision());
    let precision = if dtype == RowsDtype::F16 { "3" } else { "2" };
    (code, dtype, precision)
}

/// The rows dtypes a model is asked for: f32, and the model's own 16-bit dtype ([`half_of`]).
fn dtypes_of(m: &Model) -> [(u32, RowsDtype); 2] {
    [(0, RowsDtype::F32), half_of(m.precision())]
}

/// A model opened through the C ABI on CUDA device 0 (precision 0 = the device's default: bf16,
/// f16 on 7.5; 1 = f32).
struct Handle(*mut vt_model);

impl Handle {
    fn open(model: &str, precision: u32) -> Handle {
        let path = CString::new(fixtures().join(model).to_str().unwrap()).unwrap();
        let mut o = vt_open_options_default();
        o.device = c"cuda:0".as_ptr();
        o.precision = precision;
        let mut m = std::ptr::null_mut();
        // SAFETY: a NUL-terminated path, valid options and out-param.
        let s = unsafe { vt_model_open(path.as_ptr(), &o, &mut m) };
        assert_eq!(s, vt_status::VT_OK, "{model}: {}", last_error());
        Handle(m)
    }

    fn model(&self) -> &Model {
        // SAFETY: a live handle, freed only on drop.
        unsafe { model_of(self.0) }.unwrap()
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: a handle from vt_model_open, freed once.
        unsafe { vt_model_free(self.0) };
    }
}

fn last_error() -> String {
    // SAFETY: vt_last_error returns a NUL-terminated string valid until the next call.
    unsafe { std::ffi::CStr::from_ptr(vt_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// The caller: the primary context (as PyTorch's), its own stream and memory.
struct Caller {
    stream: Arc<CudaStream>,
}

impl Caller {
    fn new() -> Caller {
        let ctx = CudaContext::new(0).unwrap();
        Caller {
            stream: ctx.new_stream().unwrap(),
        }
    }

    fn raw_stream(&self) -> *mut c_void {
        self.stream.cu_stream().cast()
    }

    /// `bytes` of device memory poisoned with 0xff (NaN in f32 and bf16) on the caller's
    /// stream.
    fn buffer(&self, bytes: usize) -> CudaSlice<u8> {
        let mut b = self.stream.alloc_zeros::<u8>(bytes.max(1)).unwrap();
        self.stream
            .memcpy_htod(&vec![0xffu8; bytes.max(1)], &mut b)
            .unwrap();
        b
    }

    fn addr(&self, b: &CudaSlice<u8>) -> *mut c_void {
        let (p, _g) = b.device_ptr(&self.stream);
        p as usize as *mut c_void
    }

    /// The buffer's first `bytes`, copied in the caller's stream order (no sync before).
    fn read(&self, b: &CudaSlice<u8>, bytes: usize) -> Vec<u8> {
        let v = self.stream.clone_dtoh(b).unwrap();
        self.stream.synchronize().unwrap();
        v[..bytes].to_vec()
    }
}

fn images_of(bytes: &[Vec<u8>]) -> Vec<vt_image> {
    bytes
        .iter()
        .map(|b| vt_image {
            data: b.as_ptr(),
            len: b.len(),
            kind: 0,
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA device"]
fn device_rows_through_the_c_abi_are_the_rust_device_paths_bytes() {
    let bytes = image_bytes();
    let images = images_of(&bytes);
    let sources: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
    let caller = Caller::new();
    for model in MODELS {
        let h = Handle::open(model, 0);
        let m = h.model();
        for (dtype, rows_dtype) in dtypes_of(m) {
            let want = m.encode_device(&sources, rows_dtype).unwrap();
            let want_bytes = want.rows.to_host_bytes().unwrap();
            let n = want.rows.rows() * m.width();
            let buf = caller.buffer(n * rows_dtype.size());
            let mut offsets = vec![usize::MAX; images.len() + 1];
            let mut needed = 0usize;
            // SAFETY: `buf` holds n elements of the model's device; the stream is live.
            let s = unsafe {
                vt_model_encode_device(
                    h.0,
                    images.as_ptr(),
                    images.len(),
                    caller.addr(&buf),
                    n,
                    dtype,
                    caller.raw_stream(),
                    offsets.as_mut_ptr(),
                    &mut needed,
                )
            };
            assert_eq!(s, vt_status::VT_OK, "{model}: {}", last_error());
            assert_eq!(needed, n, "{model}");
            assert_eq!(offsets, want.rows.offsets(), "{model}");
            let got = caller.read(&buf, n * rows_dtype.size());
            assert!(
                got == want_bytes,
                "{model} dtype {dtype}: the C ABI's device rows differ from encode_device's"
            );
            // One element short: refused before the device is touched, `needed` reported.
            let mut needed = 0usize;
            // SAFETY: as above (one element fewer declared).
            let s = unsafe {
                vt_model_encode_device(
                    h.0,
                    images.as_ptr(),
                    images.len(),
                    caller.addr(&buf),
                    n - 1,
                    dtype,
                    caller.raw_stream(),
                    offsets.as_mut_ptr(),
                    &mut needed,
                )
            };
            assert_eq!(s, vt_status::VT_ERR_BUFFER_TOO_SMALL, "{model}");
            assert_eq!(needed, n, "{model}");
            println!("CAPI-DEVICE {model} dtype {dtype}: {n} elements, bitwise encode_device's");
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn processor_tensors_on_the_device_through_the_c_abi() {
    let caller = Caller::new();
    for (model, case) in TENSOR_CASES {
        let h = Handle::open(model, 0);
        let m = h.model();
        let file = fixtures()
            .join("outputs")
            .join(format!("{case}.safetensors"));
        let list = tensors_of_file(&file, |n| !n.contains('/')).unwrap();
        let want = m
            .encode_tensors_device(&processor_tensors(&list).unwrap(), RowsDtype::F32)
            .unwrap();
        let want_bytes = want.to_host_bytes().unwrap();
        let mut t = std::ptr::null_mut();
        // SAFETY: a valid out-param.
        assert_eq!(unsafe { vt_tensors_new(&mut t) }, vt_status::VT_OK);
        for (name, shape, values) in &list {
            let name = CString::new(name.as_str()).unwrap();
            // SAFETY: live set, NUL-terminated name, shape and values of the stated lengths.
            let s = unsafe {
                match values {
                    TensorValues::F32(v) => vt_tensors_add_f32(
                        t,
                        name.as_ptr(),
                        shape.as_ptr(),
                        shape.len(),
                        v.as_ptr(),
                        v.len(),
                    ),
                    TensorValues::I64(v) => vt_tensors_add_i64(
                        t,
                        name.as_ptr(),
                        shape.as_ptr(),
                        shape.len(),
                        v.as_ptr(),
                        v.len(),
                    ),
                }
            };
            assert_eq!(s, vt_status::VT_OK, "{}", last_error());
        }
        let n = want.rows() * m.width();
        let buf = caller.buffer(n * 4);
        let mut offsets = vec![0usize; 16];
        let mut images = 0usize;
        // SAFETY: `buf` holds n f32 of the model's device; the stream is live.
        let s = unsafe {
            vt_model_encode_tensors_device(
                h.0,
                t,
                caller.addr(&buf),
                n,
                0,
                caller.raw_stream(),
                offsets.as_mut_ptr(),
                offsets.len(),
                &mut images,
            )
        };
        assert_eq!(s, vt_status::VT_OK, "{model}: {}", last_error());
        assert_eq!(&offsets[..=images], want.offsets(), "{model}");
        assert!(
            caller.read(&buf, n * 4) == want_bytes,
            "{model} {case}: differs from encode_tensors_device"
        );
        // SAFETY: the set from vt_tensors_new, freed once.
        unsafe { vt_tensors_free(t) };
        println!("CAPI-TENSORS {model} {case}: bitwise encode_tensors_device's");
    }
}

/// (model, the upstream video tower case the CPU video tests use, `tests/video.rs`).
const VIDEO_CASES: [(&str, &str); 2] = [
    ("models/glm5_next", "glm5_next_video/fps1_odd7"),
    ("models/gemma4", "gemma4_video/g4_n2"),
];

/// A video plan as its getters give it (timestamps as bits), to compare two.
#[derive(Debug, PartialEq)]
struct PlanView {
    rows: u64,
    ids: Vec<u32>,
    counts: Vec<u64>,
    embeds: Vec<u8>,
    is_text: Vec<u8>,
    texts: Vec<String>,
    indices: Vec<u64>,
    timestamps: Vec<u64>,
    grid: Vec<u64>,
    target: (u64, u64),
}

/// Reads a live video plan.
///
/// # Safety
/// `p` is a live plan from this library.
unsafe fn plan_view(p: *const vt_video_plan) -> PlanView {
    // SAFETY: the caller's contract: the getters' arrays hold the counts they say.
    unsafe {
        let (n, k) = (vt_video_plan_piece_count(p), vt_video_plan_frame_count(p));
        let arr = |a: *const u64, len: usize| std::slice::from_raw_parts(a, len).to_vec();
        PlanView {
            rows: vt_video_plan_rows(p),
            ids: std::slice::from_raw_parts(vt_video_plan_piece_ids(p), n).to_vec(),
            counts: arr(vt_video_plan_piece_counts(p), n),
            embeds: std::slice::from_raw_parts(vt_video_plan_piece_embeds(p), n).to_vec(),
            is_text: std::slice::from_raw_parts(vt_video_plan_piece_is_text(p), n).to_vec(),
            texts: (0..n)
                .map(|i| {
                    std::ffi::CStr::from_ptr(vt_video_plan_piece_text(p, i))
                        .to_string_lossy()
                        .into_owned()
                })
                .collect(),
            indices: arr(vt_video_plan_frames_indices(p), k),
            timestamps: std::slice::from_raw_parts(vt_video_plan_timestamps(p), k)
                .iter()
                .map(|t| t.to_bits())
                .collect(),
            grid: arr(vt_video_plan_grid(p), 3),
            target: (
                vt_video_plan_target_width(p),
                vt_video_plan_target_height(p),
            ),
        }
    }
}

/// Rows of `dtype` as f32 (bf16 and f16 widened exactly).
fn values(bytes: &[u8], dtype: RowsDtype) -> Vec<f32> {
    match dtype {
        RowsDtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        RowsDtype::Bf16 => bytes
            .chunks_exact(2)
            .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
            .collect(),
        RowsDtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
    }
}

/// IEEE half bits widened to f32 exactly (subnormals, infinities and NaN included).
fn half_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let man = f32::from(h & 0x3ff);
    match exp {
        0 => sign * man * 2f32.powi(-24),
        31 if man == 0.0 => sign * f32::INFINITY,
        31 => f32::NAN,
        e => sign * (1.0 + man / 1024.0) * 2f32.powi(e - 15),
    }
}

/// The video tower cases through `vt_model_encode_video_device`, bf16 and f32 models, f32 and
/// bf16 rows, into a caller's `cuMemAlloc`'d buffer on the caller's stream: the bytes are
/// `Model::encode_video_device`'s on the very same model, the plan is `vt_model_plan_video`'s
/// (and the Rust API's), `*needed` the elements; f32 rows of the f32 model are within 1e-4
/// rel-L2 of upstream's f64 rows (the bf16 model's within 2e-2). A buffer one element short is
/// refused from the headers (frames that are BMP headers alone, never decodable) with `*needed`
/// set and nothing written; bf16 rows from the f32 model, a NULL and a misaligned `dst` get
/// `vt_model_encode_device`'s statuses.
#[test]
#[ignore = "needs a CUDA device"]
fn video_device_rows_through_the_c_abi_are_the_rust_device_paths_bytes() {
    let caller = Caller::new();
    let bytes = image_bytes();
    let image = images_of(&bytes)[0];
    for (model, name) in VIDEO_CASES {
        let c = video_case(name);
        let (video, settings) = (c.vt_video(), c.vt_settings());
        let frames = c.frames();
        let rust_video = Video {
            frames: VideoFrames::Rgb {
                width: c.width,
                height: c.height,
                frames: &frames,
            },
            metadata: c.metadata(),
        };
        let bmps = header_only_bmps(&c);
        let bmp_frames = images_of(&bmps);
        let headers_only = vt_video {
            frames: bmp_frames.as_ptr(),
            rgb: std::ptr::null(),
            rgb_len: 0,
            width: 0,
            height: 0,
            ..video
        };
        for precision in [0u32, 1] {
            let h = Handle::open(model, precision);
            let m = h.model();
            let what = format!("{name} on {model} {}", m.precision());
            let pre = m.video_preprocessor(c.settings()).unwrap();
            let mut planned = std::ptr::null_mut();
            // SAFETY: a live handle, the case's video, a valid out-param.
            let s = unsafe { vt_model_plan_video(h.0, &video, &settings, &mut planned) };
            assert_eq!(s, vt_status::VT_OK, "{what}: {}", last_error());
            // SAFETY: a plan from vt_model_plan_video, read then freed once.
            let want_plan = unsafe {
                let v = plan_view(planned);
                vt_video_plan_free(planned);
                v
            };
            let n = want_plan.rows as usize * m.width();
            for (dtype, rows_dtype) in dtypes_of(m) {
                let size = rows_dtype.size();
                let buf = caller.buffer(n * size);
                let mut needed = usize::MAX;
                let mut plan = std::ptr::null_mut();
                if rows_dtype != RowsDtype::F32 && m.precision() == Precision::F32 {
                    // SAFETY: `buf` holds n elements of the model's device; the stream is live.
                    let s = unsafe {
                        vt_model_encode_video_device(
                            h.0,
                            &video,
                            &settings,
                            caller.addr(&buf),
                            n,
                            dtype,
                            caller.raw_stream(),
                            &mut needed,
                            &mut plan,
                        )
                    };
                    assert_eq!(s, vt_status::VT_ERR_UNSUPPORTED, "{what}: {}", last_error());
                    assert!(last_error().contains("bf16 tower"), "{}", last_error());
                    assert!(needed == usize::MAX && plan.is_null(), "{what}: out-params");
                    assert!(
                        caller.read(&buf, n * size).iter().all(|b| *b == 0xff),
                        "{what}: refused bf16 rows were written"
                    );
                    continue;
                }
                let want = m
                    .encode_video_device(&pre, &rust_video, rows_dtype)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let want_bytes = want.rows.to_host_bytes().unwrap();
                assert_eq!(want_bytes.len(), n * size, "{what}: the Rust API's rows");
                // SAFETY: `buf` holds n elements of `dtype` on the model's device; the stream is
                // live; valid out-params.
                let s = unsafe {
                    vt_model_encode_video_device(
                        h.0,
                        &video,
                        &settings,
                        caller.addr(&buf),
                        n,
                        dtype,
                        caller.raw_stream(),
                        &mut needed,
                        &mut plan,
                    )
                };
                assert_eq!(s, vt_status::VT_OK, "{what}: {}", last_error());
                assert_eq!(needed, n, "{what}: *needed");
                assert!(!plan.is_null(), "{what}: no plan");
                // SAFETY: a plan from vt_model_encode_video_device, read then freed once.
                let got_plan = unsafe {
                    let v = plan_view(plan);
                    vt_video_plan_free(plan);
                    v
                };
                assert_eq!(
                    got_plan, want_plan,
                    "{what}: the plan differs from plan_video's"
                );
                assert_eq!(got_plan.rows, want.plan.rows, "{what}");
                assert_eq!(got_plan.indices, want.plan.frames_indices, "{what}");
                assert_eq!(got_plan.grid, want.plan.grid_thw.to_vec(), "{what}");
                let got = caller.read(&buf, n * size);
                assert!(
                    got == want_bytes,
                    "{what} dtype {dtype}: the C ABI's device rows differ from \
                     encode_video_device's"
                );
                let rows = values(&got, rows_dtype);
                assert!(
                    rows.iter().all(|v| v.is_finite()),
                    "{what}: NaN in the rows"
                );
                let rel = rel_l2(&rows, &c.reference);
                let bound = match (m.precision(), rows_dtype) {
                    (Precision::F32, RowsDtype::F32) => 1e-4,
                    _ => 2e-2,
                };
                assert!(
                    rel <= bound,
                    "{what} dtype {dtype}: rel-L2 {rel:e} over {bound:e}"
                );
                // One element short, frames that are headers alone: refused from the plan,
                // `*needed` set, nothing decoded (a decode would refuse a frame: see the full
                // buffer below) and nothing written.
                let short = caller.buffer(n * size);
                for (v, len, status) in [
                    (&headers_only, n - 1, vt_status::VT_ERR_BUFFER_TOO_SMALL),
                    (&video, n - 1, vt_status::VT_ERR_BUFFER_TOO_SMALL),
                    (&headers_only, n, vt_status::VT_ERR_IMAGE),
                ] {
                    let mut needed = usize::MAX;
                    let mut plan = std::ptr::null_mut();
                    // SAFETY: `short` holds n >= len elements of `dtype`; the stream is live.
                    let s = unsafe {
                        vt_model_encode_video_device(
                            h.0,
                            v,
                            &settings,
                            caller.addr(&short),
                            len,
                            dtype,
                            caller.raw_stream(),
                            &mut needed,
                            &mut plan,
                        )
                    };
                    assert_eq!(s, status, "{what} into {len}: {}", last_error());
                    let want_needed = if status == vt_status::VT_ERR_BUFFER_TOO_SMALL {
                        n
                    } else {
                        usize::MAX
                    };
                    assert_eq!(needed, want_needed, "{what} into {len}: *needed");
                    assert!(plan.is_null(), "{what}: *plan written on a refusal");
                }
                assert!(
                    caller.read(&short, n * size).iter().all(|b| *b == 0xff),
                    "{what}: a refused call wrote rows"
                );
                // A NULL and a misaligned dst: vt_model_encode_device's statuses.
                let misaligned: *mut c_void =
                    caller.addr(&short).cast::<u8>().wrapping_add(1).cast();
                for (dst, status) in [
                    (std::ptr::null_mut(), vt_status::VT_ERR_NULL_ARGUMENT),
                    (misaligned, vt_status::VT_ERR_INVALID_ARGUMENT),
                ] {
                    let mut needed = usize::MAX;
                    // SAFETY: refused before `dst` is used; the stream is live.
                    let (s, image_s) = unsafe {
                        (
                            vt_model_encode_video_device(
                                h.0,
                                &video,
                                &settings,
                                dst,
                                n,
                                dtype,
                                caller.raw_stream(),
                                &mut needed,
                                std::ptr::null_mut(),
                            ),
                            vt_model_encode_device(
                                h.0,
                                &image,
                                1,
                                dst,
                                n,
                                dtype,
                                caller.raw_stream(),
                                std::ptr::null_mut(),
                                std::ptr::null_mut(),
                            ),
                        )
                    };
                    assert_eq!(s, status, "{what}: dst {dst:?}");
                    assert_eq!(image_s, status, "{what}: the image call, dst {dst:?}");
                    assert_eq!(needed, usize::MAX, "{what}");
                }
                println!(
                    "CAPI-VIDEO-DEVICE {what} dtype {dtype}: {n} elements, bitwise \
                     encode_video_device's, rel-L2 {rel:.3e} against upstream's f64 rows \
                     (bound {bound:e})"
                );
            }
        }
    }
}

/// Fills the card: chunks from 4 GiB down to 64 KiB, each size until it fails.
fn fill_the_card(dev: &gpu_core::Device) -> (Vec<gpu_core::DeviceBuffer<f32>>, usize) {
    let mut ballast = Vec::new();
    let mut held = 0usize;
    let mut chunk = 4usize << 30;
    while chunk >= 64 << 10 {
        loop {
            match dev.alloc::<f32>(chunk / 4) {
                Ok(b) => {
                    ballast.push(b);
                    held += chunk;
                }
                Err(GpuError::OutOfMemory { .. }) => break,
                Err(e) => panic!("ballast of {chunk} bytes: {e}"),
            }
        }
        chunk /= 4;
    }
    (ballast, held)
}

#[test]
#[ignore = "needs a CUDA device"]
fn out_of_memory_through_the_c_abi_is_a_status_and_the_handle_stays_usable() {
    let bytes = image_bytes();
    let images = images_of(&bytes);
    let caller = Caller::new();
    for model in ["models/gemma4", "models/glm5_next", "models/step3p7"] {
        let h = Handle::open(model, 0);
        let mut one: *mut vt_rows = std::ptr::null_mut();
        // SAFETY: one live image, a valid out-param.
        let s = unsafe { vt_model_encode(h.0, images.as_ptr(), 1, &mut one) };
        assert_eq!(s, vt_status::VT_OK, "{}", last_error());
        // SAFETY: rows from vt_model_encode, freed once.
        unsafe { vt_rows_free(one) };
        let n: usize = bytes
            .iter()
            .map(|b| h.model().plan(ImageSource::Bytes(b)).unwrap().rows as usize)
            .sum::<usize>()
            * h.model().width();
        let buf = caller.buffer(n * 4);
        caller.stream.synchronize().unwrap();
        let dev = gpu_core::Device::new(0).unwrap();
        let (ballast, held) = fill_the_card(&dev);
        // SAFETY: `buf` holds n f32 of device 0; the stream is live.
        let s = unsafe {
            vt_model_encode_device(
                h.0,
                images.as_ptr(),
                images.len(),
                caller.addr(&buf),
                n,
                0,
                caller.raw_stream(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        let message = last_error();
        assert_eq!(
            s,
            vt_status::VT_ERR_OUT_OF_MEMORY,
            "{model}: {held} bytes of ballast: {message}"
        );
        println!("CAPI-OOM {model}: ballast {held} bytes; {message}");
        caller.stream.synchronize().unwrap();
        drop(ballast);
        dev.synchronize().unwrap();
        let mut rows: *mut vt_rows = std::ptr::null_mut();
        // SAFETY: live images, a valid out-param.
        let s = unsafe { vt_model_encode(h.0, images.as_ptr(), images.len(), &mut rows) };
        assert_eq!(s, vt_status::VT_OK, "{model} after OOM: {}", last_error());
        // SAFETY: rows from vt_model_encode.
        let (count, width) = unsafe { (vt_rows_count(rows), vt_rows_width(rows)) };
        assert_eq!(count * width, n, "{model}");
        // SAFETY: freed once.
        unsafe { vt_rows_free(rows) };
    }
}

/// The C program's device commands, checked against its own host rows of the same handle.
#[test]
#[ignore = "needs a CUDA device"]
fn the_c_program_writes_device_rows_into_a_cumemalloc_buffer_on_its_stream() {
    let dir = scratch("gpu");
    let args: Vec<String> = IMAGES
        .iter()
        .map(|i| file_arg(&fixtures().join("images").join(i)))
        .collect();
    let bytes = image_bytes();
    let sources: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
    let mut script = String::new();
    let mut expected = Vec::new();
    // the handle opened with no precision gives the device's 16-bit rows (bf16; f16 on 7.5)
    let (half, half_dtype, half_precision) = default_half();
    let half_code = half.to_string();
    for (k, model) in MODELS.iter().enumerate() {
        // The sizes, from the Rust API on the CPU (plans do not depend on the device).
        let cpu = Model::open(
            &fixtures().join(model),
            vision_towers::Device::Cpu,
            vision_towers::vision_prep::PrepSettings::default(),
        )
        .unwrap();
        let n: usize = sources
            .iter()
            .map(|s| cpu.plan(*s).unwrap().rows as usize)
            .sum::<usize>()
            * cpu.width();
        let path = fixtures().join(model);
        script.push_str(&line(&[
            &"open",
            &0,
            &path.display(),
            &"cuda",
            &0,
            &0,
            &0,
            &0,
            &0,
        ]));
        let host = dir.join(format!("m{k}-host.f32"));
        let f32_out = dir.join(format!("m{k}-dev.f32"));
        let bf16_out = dir.join(format!("m{k}-dev.bf16"));
        let join = |mut v: Vec<String>| {
            v.extend(args.clone());
            v.join("\t") + "\n"
        };
        script.push_str(&join(vec![
            "encode".into(),
            "0".into(),
            host.display().to_string(),
        ]));
        script.push_str(&join(vec![
            "encode_device".into(),
            "0".into(),
            "0".into(),
            n.to_string(),
            f32_out.display().to_string(),
        ]));
        script.push_str(&join(vec![
            "encode_device".into(),
            "0".into(),
            half_code.clone(),
            n.to_string(),
            bf16_out.display().to_string(),
        ]));
        script.push_str(&join(vec![
            "encode_device".into(),
            "0".into(),
            half_code.clone(),
            (n - 1).to_string(),
            "/dev/null".into(),
        ]));
        script.push_str(&line(&[
            &"open",
            &1,
            &path.display(),
            &"cuda",
            &1,
            &0,
            &0,
            &0,
            &0,
        ]));
        script.push_str(&join(vec![
            "encode_device".into(),
            "1".into(),
            "1".into(),
            n.to_string(),
            "/dev/null".into(),
        ]));
        script.push_str(&line(&[&"free", &0]));
        script.push_str(&line(&[&"free", &1]));
        expected.push((model.to_string(), n, host, f32_out, bf16_out, cpu));
    }
    let oom_out = dir.join("oom.f32");
    script.push_str(&line(&[
        &"open",
        &0,
        &fixtures().join("models/glm5_next").display(),
        &"cuda",
        &0,
        &0,
        &0,
        &0,
        &0,
    ]));
    let mut oom = vec!["oom".to_string(), "0".into(), oom_out.display().to_string()];
    oom.extend(args.clone());
    // A request far larger than the warm-up's (its first image): the workspace must grow past
    // what the ballast leaves, whatever the old workspace's freed blocks can hold.
    let big = file_arg(&fixtures().join("images/coffee_3100x500.jpg"));
    oom.extend(std::iter::repeat_n(big, 8));
    script.push_str(&(oom.join("\t") + "\n"));
    let run = run_script(&script, Under::Plain, "gpu");
    let mut lines = run.lines.iter().filter(|l| l.cmd() != "free");
    for (model, n, host, f32_out, bf16_out, cpu) in &expected {
        let mut next = || lines.next().expect("a result line").clone();
        let open = next();
        assert_eq!(open.status(), "VT_OK", "{model}: {:?}", open.0);
        assert_eq!(
            (open.field(5), open.field(6)),
            ("0", half_precision),
            "{model}: cuda:0 in the device's 16-bit precision"
        );
        let enc = next();
        assert_eq!(enc.status(), "VT_OK", "{model}: {:?}", enc.0);
        let f = next();
        assert_eq!(f.status(), "VT_OK", "{model}: {:?}", f.0);
        assert_eq!(f.field(3), n.to_string(), "{model}: needed");
        assert_eq!(f.field(4), enc.field(5), "{model}: offsets");
        let b = next();
        assert_eq!(b.status(), "VT_OK", "{model}: {:?}", b.0);
        let short = next();
        assert_eq!(
            (short.status(), short.field(3), short.field(4)),
            ("VT_ERR_BUFFER_TOO_SMALL", n.to_string().as_str(), "-"),
            "{model}: {:?}",
            short.0
        );
        let open32 = next();
        assert_eq!(open32.status(), "VT_OK", "{model}: {:?}", open32.0);
        let refused = next();
        assert_eq!(
            refused.status(),
            "VT_ERR_UNSUPPORTED",
            "{model}: bf16 rows from an f32 model: {:?}",
            refused.0
        );
        let host = read_f32(host);
        let dev = read_f32(f32_out);
        assert!(
            bits(&dev) == bits(&host),
            "{model}: f32 device rows differ from the rows vt_model_encode downloads"
        );
        assert!(
            dev.iter().all(|v| v.is_finite()),
            "{model}: NaN in the rows"
        );
        let bf = values(&std::fs::read(bf16_out).unwrap(), half_dtype);
        assert_eq!(bf.len(), dev.len(), "{model}");
        // one rounding step of the 16-bit dtype (f16: with its subnormals' absolute step, 2⁻²⁴)
        let (step, floor) = match half_dtype {
            RowsDtype::F16 => (1.0 / 1024.0, 6e-8),
            _ => (1.0 / 256.0, f32::MIN_POSITIVE),
        };
        for (k, (x, f)) in bf.iter().zip(&dev).enumerate() {
            assert!(
                (x - f).abs() <= f.abs() * step + floor,
                "{model}: {} element {k} = {x}, f32 {f}",
                half_dtype.name()
            );
        }
        // Across processes: the host reference within the bf16 bound (reported).
        let reference: Vec<f32> = cpu
            .encode(&sources)
            .unwrap()
            .into_iter()
            .flat_map(|e| e.rows)
            .collect();
        let (num, den) = reference
            .iter()
            .zip(&dev)
            .fold((0f64, 0f64), |(a, b), (r, d)| {
                let e = f64::from(*d) - f64::from(*r);
                (a + e * e, b + f64::from(*r) * f64::from(*r))
            });
        let rel = (num / den.max(f64::MIN_POSITIVE)).sqrt();
        assert!(
            rel <= 2e-2,
            "{model}: rel-L2 {rel:.3e} against the host path"
        );
        println!(
            "CAPI-C-DEVICE {model}: f32 device rows bitwise vt_model_encode's, {} within one \
             step, rel-L2 {rel:.3e} against the CPU reference",
            half_dtype.name()
        );
    }
    let _open = lines.next().expect("open line");
    let full = lines.next().expect("oom line");
    assert_eq!(
        full.status(),
        "VT_ERR_OUT_OF_MEMORY",
        "with {} bytes of ballast: {:?}",
        full.field(2),
        full.0
    );
    let after = lines.next().expect("oom_after line");
    assert_eq!(after.status(), "VT_OK", "{:?}", after.0);
    let rows = read_f32(&oom_out);
    assert!(rows.iter().all(|v| v.is_finite()), "rows after OOM");
    println!(
        "CAPI-C-OOM glm5_next: {} with {} bytes of ballast, then VT_OK",
        full.status(),
        full.field(2)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
