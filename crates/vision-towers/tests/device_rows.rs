//! Rows that stay on the GPU (`Model::encode_device`, `encode_device_into`,
//! `encode_tensors_device`): against the rows the same model downloads (`Model::encode`), into a
//! caller's buffer on a caller's stream, out of memory, and the refusals a CPU model gives.
//!
//! The CUDA tests are `#[ignore = "needs a CUDA device"]` (run by `cargo xtask gpu-test`); the
//! host tests run everywhere. `VT_FIXTURES` names the fixtures on a machine without this
//! checkout.
//!
//! What must hold: f32 rows on the device are bitwise the rows `encode` downloads (the same
//! projection GEMM writes both); bf16 rows are those values rounded once (within one bf16 step,
//! 2⁻⁸ relative, of the f32 rows; a GEMM tuned for a bf16 output may pick another algorithm,
//! so not always the round-to-nearest of the same f32 value); a caller's buffer receives exactly
//! the library-owned rows; no NaN ever.

mod common;

use common::{fill_the_card, fixtures, image_bytes, largest_image, CUDA_MODELS};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use vision_towers::gpu_core;
use vision_towers::vision_prep::ImageSource;
use vision_towers::{Device, DeviceOut, Model, Precision, ProcessorTensors, RowsDtype};

/// Graphs on, as a model opens by default.
fn open(model: &str, device: Device, precision: Option<Precision>, ceiling: usize) -> Model {
    common::open(model, device, precision, ceiling, true)
}

/// The dtype of the model's own rows: bf16 for a bf16 tower, f16 for an f16 one (the default on a
/// tier without bf16 tensor cores, 7.5), f32 for an f32 one.
fn lm_dtype(m: &Model) -> RowsDtype {
    match m.precision() {
        Precision::Bf16 => RowsDtype::Bf16,
        Precision::F16 => RowsDtype::F16,
        Precision::F32 => RowsDtype::F32,
    }
}

/// 16-bit rows' bytes widened to f32 exactly, with the rounding bound of `dtype` (relative, and
/// absolute for f16's subnormals: 2⁻²⁵ at most, with a margin).
fn half_bytes_to_f32(b: &[u8], dtype: RowsDtype) -> (Vec<f32>, f32, f32) {
    match dtype {
        RowsDtype::Bf16 => (bf16_bytes_to_f32(b), 1.0 / 256.0, f32::MIN_POSITIVE),
        RowsDtype::F16 => (
            b.chunks_exact(2)
                .map(|c| gpu_core::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            1.0 / 1024.0,
            6e-8,
        ),
        RowsDtype::F32 => panic!("not a 16-bit dtype"),
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn bf16_bytes_to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
        .collect()
}

#[test]
#[ignore = "needs a CUDA device"]
fn device_rows_are_the_downloaded_rows_for_every_fixture_model() {
    let bytes = image_bytes();
    let sources: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
    for model in CUDA_MODELS {
        let several = largest_image(model, &sources);
        for (precision, ceiling) in [
            (None, usize::MAX),
            (Some(Precision::F32), usize::MAX),
            (None, several),
            // f32 in several passes: forced 7.5 (f32 by default) found image 3's device rows
            // off the downloaded ones there (2026-12-06); this row asks every tier
            (Some(Precision::F32), several),
            // f16 (every tier; the default on 7.5): rows checked finite, one pass and several
            (Some(Precision::F16), usize::MAX),
            (Some(Precision::F16), several),
        ] {
            let m = open(model, Device::Cuda(0), precision, ceiling);
            let what = format!("{model} {} ceiling {ceiling}", m.precision());
            // twice: the second call replays a captured graph of the same layout
            for round in 0..3 {
                let host = m.encode(&sources).unwrap_or_else(|e| panic!("{what}: {e}"));
                let called = std::time::Instant::now();
                let dev = m
                    .encode_device(&sources, RowsDtype::F32)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                // the call's own stages: each one ran (decoding images takes time, so does
                // queueing a forward) and together they are no longer than the call
                let t = dev.timings;
                assert!(
                    !t.prepare.is_zero() && !t.upload.is_zero() && !t.launch.is_zero(),
                    "{what}: a stage of the request went untimed: {t:?}"
                );
                assert!(t.total() <= called.elapsed(), "{what}: {t:?} past the call");
                assert_eq!(dev.rows.width(), m.width(), "{what}");
                assert_eq!(dev.rows.images(), sources.len(), "{what}");
                let got = dev.rows.to_host_f32().unwrap();
                assert!(got.iter().all(|v| v.is_finite()), "{what}: NaN or infinity");
                for (i, e) in host.iter().enumerate() {
                    assert_eq!(dev.plans[i], e.plan, "{what}: image {i}");
                    let r = dev.rows.image_rows(i).unwrap();
                    assert_eq!(r.len(), e.plan.rows as usize, "{what}: image {i}");
                    let w = m.width();
                    let d = &got[r.start * w..r.end * w];
                    assert!(
                        bits(d) == bits(&e.rows),
                        "{what}: image {i} round {round}: device rows differ from downloaded \
                         ones (rel-L2 {:e})",
                        gpu_core::tower_core::rel_l2(d, &e.rows)
                    );
                }
                // the tower's own 16-bit dtype within its rounding of the f32 rows; the other
                // 16-bit dtype refused (cuBLASLt writes 16 bits only from inputs of that type)
                let own = lm_dtype(&m);
                for half in [RowsDtype::Bf16, RowsDtype::F16] {
                    if half != own {
                        let err = m.encode_device(&sources, half).unwrap_err();
                        assert!(err.to_string().contains("tower"), "{what}: {err}");
                        continue;
                    }
                    let b = m.encode_device(&sources, half).unwrap();
                    let (b, rel, abs) = half_bytes_to_f32(&b.rows.to_host_bytes().unwrap(), half);
                    assert_eq!(b.len(), got.len(), "{what}");
                    for (k, (x, f)) in b.iter().zip(&got).enumerate() {
                        assert!(
                            (x - f).abs() <= f.abs() * rel + abs,
                            "{what}: {half:?} element {k} = {x}, f32 {f}"
                        );
                    }
                }
            }
            println!("DEVICE-ROWS {what}: bitwise equal to the downloaded rows");
        }
    }
}

/// A caller's CUDA context (the primary one, as PyTorch's), stream and memory.
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

    fn raw_stream(&self) -> u64 {
        self.stream.cu_stream() as usize as u64
    }

    fn addr(&self, buf: &CudaSlice<u16>) -> u64 {
        let (p, _g) = buf.device_ptr(&self.stream);
        p
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn rows_go_into_a_callers_buffer_in_its_stream_order() {
    let bytes = image_bytes();
    let sources: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
    let caller = Caller::new();
    for model in ["models/gemma4", "models/glm5_next", "models/step3p7"] {
        // the default precision: bf16 from 8.0, f16 on a tier without bf16 (7.5); either way the
        // tower's own 16-bit rows, and the other 16-bit dtype refused, by design
        let m = open(model, Device::Cuda(0), None, usize::MAX);
        let dtype = lm_dtype(&m);
        let other = match dtype {
            RowsDtype::Bf16 => RowsDtype::F16,
            RowsDtype::F16 => RowsDtype::Bf16,
            RowsDtype::F32 => panic!("{model}: the default precision is 16-bit on every tier"),
        };
        let Err(e) = m.encode_device(&sources, other) else {
            panic!(
                "{model}: {other:?} rows from a {} tower must be refused",
                m.precision()
            )
        };
        println!(
            "{model}: {} tower, {other:?} rows refused as they must be ({e})",
            m.precision()
        );
        let want = m.encode_device(&sources, dtype).unwrap();
        let want_bytes = want.rows.to_host_bytes().unwrap();
        let n = want.rows.rows() * m.width();
        // Poisoned (0xffff is a NaN in bf16 and in f16) by the caller on its stream, then written by us.
        let mut buf = caller.stream.alloc_zeros::<u16>(n).unwrap();
        caller
            .stream
            .memcpy_htod(&vec![0xffffu16; n], &mut buf)
            .unwrap();
        // SAFETY: `buf` holds n 16-bit elements of device 0 and lives until the end of the loop.
        let out = unsafe { DeviceOut::new(caller.addr(&buf), n, dtype, 0, caller.raw_stream()) };
        let plans = m.encode_device_into(&sources, &out).unwrap();
        assert_eq!(plans, want.plans, "{model}");
        // No synchronize: the copy is queued on the caller's stream after the rows.
        let got: Vec<u16> = caller.stream.clone_dtoh(&buf).unwrap();
        caller.stream.synchronize().unwrap();
        let got: Vec<u8> = got.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(got, want_bytes, "{model}: caller's buffer differs");
        // Too small: refused before anything is written.
        // SAFETY: as above (one element fewer).
        let short =
            unsafe { DeviceOut::new(caller.addr(&buf), n - 1, dtype, 0, caller.raw_stream()) };
        let err = m.encode_device_into(&sources, &short).unwrap_err();
        assert!(err.to_string().contains("holds"), "{model}: {err}");
        println!("DEVICE-INTO {model}: {n} {dtype:?} elements, bitwise the library's rows");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_consumer_stream_made_to_wait_reads_the_rows_without_a_host_sync() {
    let bytes = image_bytes();
    let sources: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
    let caller = Caller::new();
    let m = open("models/step3p7", Device::Cuda(0), None, usize::MAX);
    let want = m.encode(&sources).unwrap();
    for round in 0..20 {
        let dev = m.encode_device(&sources, RowsDtype::F32).unwrap();
        // SAFETY: the caller's stream lives until the end of the test, after `dev` drops.
        unsafe { dev.rows.wait_on_stream(caller.raw_stream()) }.unwrap();
        let mut host = vec![0f32; dev.rows.rows() * m.width()];
        // SAFETY: the rows hold exactly host.len() f32 values and live until after the sync.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                &mut host,
                dev.rows.device_ptr(),
                caller.stream.cu_stream(),
            )
        }
        .unwrap();
        caller.stream.synchronize().unwrap();
        let expect: Vec<f32> = want.iter().flat_map(|e| e.rows.iter().copied()).collect();
        assert_eq!(bits(&host), bits(&expect), "round {round}");
        drop(dev); // freed after the caller's stream's copy (already done here)
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn out_of_memory_for_device_rows_is_an_error_and_the_model_stays_usable() {
    let bytes = image_bytes();
    let sources: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
    let m = open("models/glm5_next", Device::Cuda(0), None, usize::MAX);
    let before = m.encode_device(&sources, lm_dtype(&m)).unwrap();
    let before = before.rows.to_host_bytes().unwrap();
    let dev = gpu_core::Device::new(0).unwrap();
    let (ballast, _held) = fill_the_card(&dev);
    let err = m.encode_device(&sources, lm_dtype(&m)).unwrap_err();
    assert!(err.is_out_of_memory(), "expected out of memory, got {err}");
    drop(ballast);
    dev.synchronize().unwrap();
    let after = m.encode_device(&sources, lm_dtype(&m)).unwrap();
    assert_eq!(
        after.rows.to_host_bytes().unwrap(),
        before,
        "rows after OOM"
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn processor_tensors_on_the_device_equal_bytes_on_the_device() {
    for (model, case, images) in TENSOR_CASES {
        let m = open(model, Device::Cuda(0), None, usize::MAX);
        let t = tensors(case);
        let bytes = case_images(&images);
        let sources: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
        let from_bytes = m.encode_device(&sources, RowsDtype::F32).unwrap();
        let from_tensors = m.encode_tensors_device(&t, RowsDtype::F32).unwrap();
        assert_eq!(from_tensors.offsets(), from_bytes.rows.offsets(), "{model}");
        assert_eq!(
            bits(&from_tensors.to_host_f32().unwrap()),
            bits(&from_bytes.rows.to_host_f32().unwrap()),
            "{model} {case}"
        );
    }
}

/// (model, a tower fixture holding the upstream processor's tensors of these images).
const TENSOR_CASES: [(&str, &str, [&str; 2]); 4] = [
    (
        "models/gemma4",
        "gemma4/batch2",
        ["tiny_20x15.png", "camera_gray_96x96.png"],
    ),
    (
        "models/glm5_next",
        "glm5_next/batch2",
        ["logo_rgba_112x84.png", "tiny_20x15.png"],
    ),
    (
        "models/glm_ocr",
        "glm_ocr/batch2",
        ["logo_rgba_112x84.png", "tiny_20x15.png"],
    ),
    (
        "models/step3p7",
        "step3p7/batch2",
        ["astronaut_336x224.jpg", "tiny_20x15.png"],
    ),
];

fn case_images(names: &[&str]) -> Vec<Vec<u8>> {
    names
        .iter()
        .map(|n| std::fs::read(fixtures().join("images").join(n)).unwrap())
        .collect()
}

/// The fixture's float64 reference rows (upstream, all images concatenated).
fn reference_rows(case: &str) -> Vec<f64> {
    let path = fixtures()
        .join("outputs")
        .join(format!("{case}.safetensors"));
    let ck = vision_towers::st_reader::Checkpoint::open(&path).unwrap();
    let t = ck.tensor("f64/rows").unwrap();
    t.bytes()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The upstream processor's tensors of one fixture case.
fn tensors(case: &str) -> ProcessorTensors {
    let path = fixtures()
        .join("outputs")
        .join(format!("{case}.safetensors"));
    let ck = vision_towers::st_reader::Checkpoint::open(&path).unwrap();
    let mut t = ProcessorTensors::new();
    // The processor's tensors; the activations are stored under `f32/…` and `f64/…`.
    for info in ck.tensors().filter(|i| !i.name.contains('/')) {
        let v = ck.tensor(&info.name).unwrap();
        let shape = v.shape().to_vec();
        match v.dtype().as_str() {
            "I64" => {
                let vals = v
                    .bytes()
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                t.insert_i64(&info.name, shape, vals).unwrap();
            }
            "U8" | "BOOL" => {
                let vals = v.bytes().iter().map(|&b| i64::from(b)).collect();
                t.insert_i64(&info.name, shape, vals).unwrap();
            }
            _ => t
                .insert_f32(&info.name, shape, v.to_f32().unwrap())
                .unwrap(),
        }
    }
    t
}

#[test]
fn a_cpu_model_refuses_device_rows_and_says_why() {
    let bytes = image_bytes();
    let m = open("models/gemma4", Device::Cpu, None, usize::MAX);
    let err = m
        .encode_device(&[ImageSource::Bytes(&bytes[0])], RowsDtype::F32)
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("model opened on CUDA") && text.contains("cpu"),
        "{text}"
    );
}

#[test]
fn processor_tensors_on_the_host_equal_bytes_on_the_host() {
    for (model, case, images) in TENSOR_CASES {
        let m = open(model, Device::Cpu, None, usize::MAX);
        let bytes = case_images(&images);
        let sources: Vec<ImageSource<'_>> = bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
        let from_bytes = m.encode(&sources).unwrap();
        let from_tensors = m.encode_tensors(&tensors(case)).unwrap();
        assert_eq!(from_tensors.per_image.len(), images.len(), "{model}");
        for (i, e) in from_bytes.iter().enumerate() {
            assert_eq!(
                bits(&from_tensors.per_image[i]),
                bits(&e.rows),
                "{model} image {i}"
            );
        }
        let got: Vec<f32> = from_tensors.per_image.concat();
        let want = reference_rows(case);
        let num: f64 = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (f64::from(*g) - w).powi(2))
            .sum();
        let den: f64 = want.iter().map(|w| w * w).sum();
        let rel = (num / den).sqrt();
        assert_eq!(got.len(), want.len(), "{model}");
        assert!(
            rel <= 1e-5,
            "{model} {case}: rel-L2 {rel:e} against upstream f64"
        );
    }
}

#[test]
fn a_tensor_whose_values_do_not_fill_its_shape_is_refused() {
    let mut t = ProcessorTensors::new();
    let err = t
        .insert_f32("pixel_values", vec![2, 3], vec![0.0; 5])
        .unwrap_err();
    assert_eq!((err.expected, err.got), (6, 5));
    assert!(t
        .insert_i64("image_grid_thw", vec![usize::MAX, 2], vec![1, 2])
        .is_err());
    assert_eq!(t.names().count(), 0);
}
