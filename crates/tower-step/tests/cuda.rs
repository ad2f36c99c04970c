//! The CUDA path against the host reference on the fixture towers, on batches the parity
//! fixtures do not cover: crops of two images around a global-only image of another, non-square,
//! odd grid (views regrouped by grid size on the device), and workspace reuse across batches.
//! Needs a CUDA device: `#[ignore]`d in CI; on the GPU machine run the release test binary with
//! `--ignored` (`VT_FIXTURES` points at the fixtures when the compile-time path is absent).

use gpu_core::host::rel_l2;
use gpu_core::DeviceTower;
use std::path::PathBuf;
use std::sync::Arc;
use tower_step::cuda::{Device, GpuError};
use tower_step::{Precision, StepImage, StepStages, StepTower, StepView};

fn fixtures() -> PathBuf {
    match std::env::var_os("VT_FIXTURES") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"),
    }
}

fn tower(dir: &str) -> StepTower {
    let ck = st_reader::Checkpoint::open(fixtures().join("models").join(dir)).expect("fixture");
    StepTower::from_checkpoint(&ck).expect("fixture tower")
}

/// Deterministic pseudo-random pixels in [-2, 2].
fn pixels(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

fn view(p: &[f32], height: usize, width: usize) -> StepView<'_> {
    StepView {
        pixels: p,
        height,
        width,
    }
}

/// The GPU. This test is `#[ignore]`d; run with `--ignored` it fails, never passes, without one.
fn device() -> Arc<Device> {
    match Device::new(0) {
        Ok(d) => Arc::new(d),
        Err(GpuError::NoDevice(why)) => panic!("needs a CUDA device: {why}"),
        Err(e) => panic!("device: {e}"),
    }
}

fn stage_errors(got: &StepStages, want: &StepStages) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for (kind, a, b) in [
        ("global", &got.global, &want.global),
        ("local", &got.local, &want.local),
    ] {
        for ((name, x), (_, y)) in a.named().iter().zip(b.named()) {
            out.push((format!("{kind}/{name}"), rel_l2(x, y)));
        }
    }
    out.push(("rows".into(), rel_l2(&got.rows, &want.rows)));
    out
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_matches_host_on_a_regrouped_batch() {
    let dev = device();
    let crops: Vec<Vec<f32>> = (0..5).map(|i| pixels(3 * 112 * 112, 20 + i)).collect();
    let (g0, g1, g2) = (
        pixels(3 * 168 * 168, 1),
        pixels(3 * 140 * 126, 2),
        pixels(3 * 168 * 168, 3),
    );
    let images = vec![
        StepImage {
            crops: crops[..3].iter().map(|p| view(p, 112, 112)).collect(),
            global: view(&g0, 168, 168),
            newline_mask: vec![false, false, true],
        },
        StepImage {
            crops: vec![],
            global: view(&g1, 140, 126),
            newline_mask: vec![],
        },
        StepImage {
            crops: crops[3..].iter().map(|p| view(p, 112, 112)).collect(),
            global: view(&g2, 168, 168),
            newline_mask: vec![true, false],
        },
    ];
    for dir in ["step3p7", "step3p7_hf"] {
        let t = tower(dir);
        let (want, want_stages) = t.forward_host(&images, true).unwrap();
        let want_stages = want_stages.unwrap();
        for (p, bound) in [
            (Precision::F32, 1e-4),
            (Precision::Bf16, 2e-2),
            (Precision::F16, 2e-2),
        ] {
            if dev.precision_refusal(p).is_some() {
                // a tier without bf16 tensor cores (7.5) refuses a bf16 upload, by design
                let Err(e) = t.to_cuda(dev.clone(), p) else {
                    panic!("{dir} {p:?}: a refused precision uploaded")
                };
                println!("{dir} {p:?}: refused on tier {} ({e})", dev.tier());
                continue;
            }
            let mut c = t.to_cuda(dev.clone(), p).unwrap();
            let (rows, stages) = c.encode(&images, true).unwrap();
            for (g, w) in rows.iter().zip(&want) {
                assert_eq!(g.crop_rows, w.crop_rows);
                assert_eq!(g.global_rows, w.global_rows);
                assert_eq!(g.newline_mask, w.newline_mask);
                let r = rel_l2(&g.rows, &w.rows);
                assert!(r <= bound, "{dir} {p:?}: rows rel-L2 {r}");
            }
            for (name, r) in stage_errors(&stages.unwrap(), &want_stages) {
                println!("{dir} {p:?} {name}: {r:.2e}");
                assert!(r <= bound, "{dir} {p:?} {name}: rel-L2 {r} > {bound}");
            }
            // A smaller batch after a larger one (the workspace is kept), twice: the same rows,
            // and the same rows as that image inside the larger batch (segments kept apart).
            let one = c.encode(&images[1..2], false).unwrap().0;
            let again = c.encode(&images[1..2], false).unwrap().0;
            assert_eq!(one[0].rows, again[0].rows, "{dir} {p:?}: rerun differs");
            let r = rel_l2(&one[0].rows, &rows[1].rows);
            // (different GEMM shapes may round differently in bf16; a leak between segments
            // would be O(1))
            assert!(r <= bound, "{dir} {p:?}: alone vs in batch rel-L2 {r}");
        }
    }
}
