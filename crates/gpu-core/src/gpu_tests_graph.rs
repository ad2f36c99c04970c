//! Device tests of graphs, staged batch uploads and the chunked weight upload. Each needs a CUDA
//! device (`cargo xtask gpu-test`); without one they fail.
use crate::gpu_tests::Rng;
use crate::*;

fn dev() -> Device {
    Device::new(0).expect("a CUDA device")
}

/// `y = rms_norm(x·Wᵀ)` then quick_gelu in place: a GEMM (cuBLASLt on its workspace) and two
/// kernels, all on fixed buffers.
fn work(
    d: &Device,
    x: &DeviceBuffer<bf16>,
    w: &DeviceBuffer<bf16>,
    mid: &mut DeviceBuffer<f32>,
    y: &mut DeviceBuffer<bf16>,
    (m, n, k): (usize, usize, usize),
) -> Result<()> {
    d.gemm(
        GemmInputs::Bf16 { x, w },
        None,
        GemmOutput::F32(mid),
        GemmShape::dense(m, n, k),
        Epilogue::None,
    )?;
    let mm = Mat::dense(m, n);
    d.rms_norm(mid, mm, None, y, mm, 1e-6, Clamp::NONE)?;
    d.act_in_place(y, mm, Activation::QuickGelu, Clamp::NONE, Clamp::NONE)
}

fn bf(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_captured_graph_replays_the_eager_result_bitwise_on_new_data() {
    let d = dev();
    let (m, n, k) = (300, 256, 192);
    let mut r = Rng::new(3);
    let mut x = d.upload(&bf(&r.vec(m * k, 1.0))).unwrap();
    let w = d.upload(&bf(&r.vec(n * k, 0.1))).unwrap();
    let mut mid = d.alloc::<f32>(m * n).unwrap();
    let mut y = d.alloc::<bf16>(m * n).unwrap();
    work(&d, &x, &w, &mut mid, &mut y, (m, n, k)).unwrap();
    let eager = d.download(&y).unwrap();
    d.fill(&mut y, bf16::from_f32(f32::NAN)).unwrap();
    let mut g = d
        .capture(|d| work(d, &x, &w, &mut mid, &mut y, (m, n, k)))
        .expect("capture");
    assert!(
        d.download(&y).unwrap().iter().all(|v| v.to_f32().is_nan()),
        "capturing runs nothing"
    );
    g.launch().unwrap();
    let replay = d.download(&y).unwrap();
    assert!(
        eager
            .iter()
            .zip(&replay)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "graph replay differs from the eager run"
    );
    // New input values in the same buffer: the graph reads them at launch.
    let x2 = bf(&r.vec(m * k, 1.0));
    d.upload_into(&x2, &mut x).unwrap();
    g.launch().unwrap();
    let replay2 = d.download(&y).unwrap();
    work(&d, &x, &w, &mut mid, &mut y, (m, n, k)).unwrap();
    let eager2 = d.download(&y).unwrap();
    assert!(eager2
        .iter()
        .zip(&replay2)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(eager2 != eager, "the new input changed the result");
    println!("GRAPH replay bitwise equal to eager on two inputs");
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_capture_that_synchronises_fails_and_the_stream_runs_again() {
    let d = dev();
    let mut b = d.upload(&[0.5f32; 16]).unwrap();
    let r = d.capture(|d| -> Result<()> {
        d.act_in_place(
            &mut b,
            Mat::dense(4, 4),
            Activation::QuickGelu,
            Clamp::NONE,
            Clamp::NONE,
        )?;
        d.synchronize()
    });
    match r {
        Err(e) => println!("GRAPH refused as expected: {e}"),
        Ok(_) => panic!("a capture with a synchronisation inside must fail"),
    }
    // The stream works eagerly again, and the captured launch never ran.
    assert_eq!(d.download(&b).unwrap(), [0.5; 16]);
    let c = d.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    assert_eq!(d.download(&c).unwrap(), [1.0, 2.0, 3.0]);
}

#[test]
#[ignore = "needs a CUDA device"]
fn staged_inputs_arrive_in_the_fixed_buffers_and_expire_after_two_more() {
    let d = dev();
    let mut up = Uploader::new(&d).unwrap();
    let mut fixed = InputBuffers::alloc(&d, Precision::Bf16, 1 << 21, 1 << 12, 64).unwrap();
    let mut r = Rng::new(9);
    // 0.74–3.7 MB of bf16 rows: a spread copy takes 1–3 threads on them.
    let batches: Vec<HostInputs> = (0..5)
        .map(|i| HostInputs {
            rows: HostGemm::from_f32(Precision::Bf16, r.vec(10_000 * (i + 1) * 37, 2.0)),
            pos: (0..(200 * (i + 1)) as i32).collect(),
            cu: vec![0, 7, 100 * (i as i32 + 1)],
        })
        .collect();
    let mut staged = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        // Both ways of copying into the slot, alternately.
        let copy = if i % 2 == 0 {
            HostCopy::Spread
        } else {
            HostCopy::OneThread
        };
        staged.push(up.stage(&d, b, copy).unwrap());
        // Load the previous one while this one is in flight, as a pipeline does.
        if i > 0 {
            d.load_inputs(&staged[i - 1], Some(&up), &mut fixed)
                .unwrap();
            let want = &batches[i - 1];
            let HostGemm::Bf16(rows) = &want.rows else {
                unreachable!()
            };
            let GemmBuffer::Bf16(fr) = &fixed.rows else {
                unreachable!()
            };
            assert_eq!(&d.download_prefix(fr, rows.len()).unwrap(), rows);
            assert_eq!(
                d.download_prefix(&fixed.pos, want.pos.len()).unwrap(),
                want.pos
            );
            assert_eq!(
                d.download_prefix(&fixed.cu, want.cu.len()).unwrap(),
                want.cu
            );
        }
    }
    println!("STAGING pinned bytes held: {}", up.pinned_bytes());
    // staged[2] was refilled by staged[4]: refused, not silently wrong.
    assert!(matches!(
        d.load_inputs(&staged[2], Some(&up), &mut fixed),
        Err(GpuError::Staging(_))
    ));
    // Another uploader's batch is refused too.
    let other = Uploader::new(&d).unwrap();
    assert!(matches!(
        d.load_inputs(&staged[4], Some(&other), &mut fixed),
        Err(GpuError::Staging(_))
    ));
    d.load_inputs(&staged[4], Some(&up), &mut fixed).unwrap();
    let owned = d.upload_inputs(&batches[0]).unwrap();
    d.load_inputs(&owned, None, &mut fixed).unwrap();
    assert_eq!(d.download_prefix(&fixed.pos, 200).unwrap(), batches[0].pos);
}

#[test]
#[ignore = "needs a CUDA device"]
fn the_stager_uploads_many_chunks_in_either_precision() {
    let d = dev();
    let mut st = Stager::new(&d).unwrap();
    let mut r = Rng::new(5);
    // 3.5 staging buffers of f32, 7 of bf16.
    let n = STAGING_BYTES / 4 * 7 / 2 + 13;
    let v = r.vec(n, 3.0);
    let b: DeviceBuffer<bf16> = st.upload(&d, &v).unwrap();
    assert_eq!(d.download(&b).unwrap(), bf(&v));
    let f: DeviceBuffer<f32> = st.upload(&d, &v).unwrap();
    assert_eq!(d.download(&f).unwrap(), v);
    let bytes: Vec<u8> = bf(&v).iter().flat_map(|x| x.to_le_bytes()).collect();
    let src = LeBytes::new(&bytes, LeDtype::Bf16).unwrap();
    let g = st.upload_gemm(&d, Precision::Bf16, &src).unwrap();
    let GemmBuffer::Bf16(g) = g else {
        unreachable!()
    };
    assert_eq!(d.download(&g).unwrap(), bf(&v));
    println!("STAGER uploaded {} bytes", st.uploaded_bytes());
}
