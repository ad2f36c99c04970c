use super::*;
use gpu_core::host;

fn lin(out: usize, inp: usize, seed: u32) -> Linear {
    let w = host::test_values(out * inp, seed);
    Linear {
        w,
        b: None,
        out,
        inp,
    }
}

/// The permuted downsample on the dense block-major rows equals the host's
/// `block_gather_2x2` + GEMM with the checkpoint's (c, ky, kx) columns.
#[test]
fn permuted_downsample_matches_gather() {
    let (h, o, blocks) = (12, 7, 5);
    let n = 4 * blocks;
    let x: Vec<f32> = (0..n * h).map(|i| (i % 23) as f32 / 11.0 - 1.0).collect();
    let l = lin(o, 4 * h, 3);
    let gathered = host::block_gather_2x2(&x, n, h, None);
    let want = host::gemm(&gathered, &l.w, None, blocks, o, 4 * h);
    let got = host::gemm(
        &x,
        &permute_downsample(&l.w, l.inp, h, 4),
        None,
        blocks,
        o,
        4 * h,
    );
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    }
}

/// `prepare_host` as it was before the conversion checked finiteness in its own pass
/// (docs/PERF.md v0.16): the host path's `validate` image by image, then each value through
/// `half`'s `bf16::from_f32` one after another, around the same layout (`host_batch`). The
/// reference of the test below.
fn prepare_host_reference(
    cfg: &GlmConfig,
    precision: Precision,
    images: &[GlmImage<'_>],
) -> CudaResult<GlmHostBatch> {
    let rows = images
        .iter()
        .enumerate()
        .map(|(i, img)| crate::forward::validate(cfg, img, i))
        .collect::<Result<Vec<_>, GlmError>>()?;
    let all: Vec<f32> = images
        .iter()
        .flat_map(|i| i.patches.iter().copied())
        .collect();
    let patch_rows = match precision {
        Precision::Bf16 => {
            HostGemm::Bf16(all.iter().map(|&x| gpu_core::bf16::from_f32(x)).collect())
        }
        Precision::F16 => HostGemm::F16(all.iter().map(|&x| gpu_core::f16::from_f32(x)).collect()),
        Precision::F32 => HostGemm::F32(all),
    };
    host_batch(cfg, precision, images, &rows, patch_rows)
}

/// Every field of two host batches, bit for bit (bf16, f16 and f32 compared as bits).
fn assert_same(got: &GlmHostBatch, want: &GlmHostBatch, what: &str) {
    assert_eq!(got.meta().n, want.meta().n, "{what}");
    assert_eq!(got.meta().cu, want.meta().cu, "{what}");
    assert_eq!(got.rows_per_image(), want.rows_per_image(), "{what}");
    assert_eq!(got.graph_key(), want.graph_key(), "{what}");
    assert_eq!(got.inputs().pos, want.inputs().pos, "{what}");
    assert_eq!(got.inputs().cu, want.inputs().cu, "{what}");
    let bits = |h: &HostGemm| -> Vec<u32> {
        match h {
            HostGemm::Bf16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
            HostGemm::F16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
            HostGemm::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        }
    };
    assert_eq!(
        got.inputs().rows.precision(),
        want.inputs().rows.precision(),
        "{what}"
    );
    assert!(
        bits(&got.inputs().rows) == bits(&want.inputs().rows),
        "{what}: rows differ"
    );
}

fn fixture(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(rel)
}

/// The fixture model's config and the upstream processor's pixel values and grids of `case`.
fn fixture_inputs(variant: &str, case: &str) -> (GlmConfig, Vec<f32>, Vec<[usize; 3]>) {
    let config: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fixture(&format!("models/{variant}/config.json"))).expect("config"),
    )
    .expect("config JSON");
    let cfg = GlmConfig::from_hf(&config).expect("config");
    let ck = st_reader::Checkpoint::open(fixture(&format!("outputs/{variant}/{case}.safetensors")))
        .expect("oracle file");
    let pv = ck.find("pixel_values").expect("pixel_values");
    let pv = ck.to_f32(&pv).expect("f32");
    let thw = ck.find("image_grid_thw").expect("image_grid_thw");
    let thw: Vec<usize> = thw
        .bytes()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as usize)
        .collect();
    let grids = thw.chunks_exact(3).map(|g| [g[0], g[1], g[2]]).collect();
    (cfg, pv, grids)
}

/// The images of `pv` cut by their grids.
fn cut<'a>(cfg: &GlmConfig, pv: &'a [f32], grids: &[[usize; 3]]) -> Vec<GlmImage<'a>> {
    let mut at = 0;
    grids
        .iter()
        .map(|&g| {
            let n = g[0] * g[1] * g[2] * cfg.patch_dim();
            let img = GlmImage {
                patches: &pv[at..at + n],
                grid_thw: g,
            };
            at += n;
            img
        })
        .collect()
}

/// The host batch (bf16 or f32 rows, positions, segments, rows per image, graph key) equals
/// the reference's bit for bit: on the fixture models' upstream processor outputs (images,
/// a batch of two, a video), and on a synthetic release-size grid (1920×1080 → 78×138
/// patches, 12.7 M values, the rounding ties and signed zeros among them) alone and batched
/// with a video-like t = 2 entry; errors are the reference's, in its order.
#[test]
fn prepare_host_matches_the_reference_bit_for_bit() {
    let mut cases = Vec::new();
    for variant in ["glm5_next", "glm_ocr"] {
        for case in ["batch2", "tiny_20x15"] {
            cases.push((variant, case));
        }
    }
    cases.push(("glm5_next", "video_t2"));
    for (variant, case) in cases {
        let (cfg, pv, grids) = fixture_inputs(variant, case);
        let images = cut(&cfg, &pv, &grids);
        for p in [Precision::Bf16, Precision::F16, Precision::F32] {
            let got = GlmCuda::prepare_host(&cfg, p, &images).expect("prepare_host");
            let want = prepare_host_reference(&cfg, p, &images).expect("reference");
            assert_same(&got, &want, &format!("{variant}/{case} {p:?}"));
        }
    }
    // Release size: glm5_next's patch rows (3·2·14² = 1 176 values) on its 1080p grid.
    let (mut cfg, _, _) = fixture_inputs("glm5_next", "tiny_20x15");
    cfg.patch = 14;
    cfg.temporal_patch = 2;
    let big = [1, 78, 138];
    let small = [2, 4, 6];
    let n = |g: [usize; 3]| g[0] * g[1] * g[2] * cfg.patch_dim();
    let mut x = 0x9E37_79B9u32;
    let pv: Vec<f32> = (0..n(big) + n(small))
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            match i % 7 {
                // Ties (low half 0x8000) with even and odd kept parts, and signed zeros.
                0 => f32::from_bits((x & 0xFFFF_0000 & !0x4000_0000) | 0x8000),
                1 => -0.0,
                _ => (x as f32 / u32::MAX as f32 - 0.5) * 5.0,
            }
        })
        .collect();
    for grids in [vec![big], vec![small, big], vec![big, small]] {
        let images = cut(&cfg, &pv, &grids);
        for p in [Precision::Bf16, Precision::F16, Precision::F32] {
            let got = GlmCuda::prepare_host(&cfg, p, &images).expect("prepare_host");
            let want = prepare_host_reference(&cfg, p, &images).expect("reference");
            assert_same(&got, &want, &format!("synthetic {grids:?} {p:?}"));
        }
    }
    // Errors: a NaN in image 1 and a bad shape in image 2 (the NaN comes first), an infinity
    // in image 0 only, a bad shape in image 0 before image 1's NaN.
    let mut bad = pv[..2 * n(small) + n(small)].to_vec();
    bad[n(small) + 5] = f32::NAN;
    let err = |images: &[GlmImage<'_>]| {
        let got = GlmCuda::prepare_host(&cfg, Precision::Bf16, images).map(|_| ());
        let want = prepare_host_reference(&cfg, Precision::Bf16, images).map(|_| ());
        let (Err(g), Err(w)) = (got, want) else {
            panic!("both must refuse")
        };
        assert_eq!(g.to_string(), w.to_string());
        g.to_string()
    };
    let m1 = err(&[
        GlmImage {
            patches: &bad[..n(small)],
            grid_thw: small,
        },
        GlmImage {
            patches: &bad[n(small)..2 * n(small)],
            grid_thw: small,
        },
        GlmImage {
            patches: &bad[2 * n(small)..],
            grid_thw: [1, 3, 6],
        },
    ]);
    assert!(m1.contains("image 1: non-finite"), "{m1}");
    let mut inf = pv[..n(small)].to_vec();
    inf[n(small) - 1] = f32::NEG_INFINITY;
    let m2 = err(&[GlmImage {
        patches: &inf,
        grid_thw: small,
    }]);
    assert!(m2.contains("image 0: non-finite"), "{m2}");
    let m3 = err(&[
        GlmImage {
            patches: &bad[..n(small)],
            grid_thw: [1, 4, 4],
        },
        GlmImage {
            patches: &bad[n(small)..2 * n(small)],
            grid_thw: small,
        },
    ]);
    assert!(
        m3.contains("image 0:") && !m3.contains("non-finite"),
        "{m3}"
    );
}

/// The swiglu law of glm5_next is the host path's (limit on the gate, clamp on up).
#[test]
fn swiglu_law_matches_host() {
    let g = Gate::swiglu_clamped(1.5);
    assert_eq!(g.gate_limit, 1.5);
    assert_eq!(g.up, Clamp::new(-1.5, 1.5));
    assert_eq!(g.gate, Clamp::NONE);
    assert_eq!(g.out, Clamp::NONE);
}
