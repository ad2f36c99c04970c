//! The host forward against the oracle (upstream float64 references), plus its input laws.

mod common;

use common::{fixtures, oracle, rel_l2};
use gpu_core::host;
use st_reader::Checkpoint;
use tower_glm5::{vision_cu_seqlens, vision_positions, GlmError, GlmImage, GlmTower};

fn tower(variant: &str) -> GlmTower {
    let ck = Checkpoint::open(fixtures().join("models").join(variant)).expect("open");
    GlmTower::from_checkpoint(&ck).expect("loads")
}

fn inputs(variant: &str, case: &str) -> (Vec<f32>, Vec<[usize; 3]>) {
    let (_, pv) = oracle(variant, case, "pixel_values");
    let (_, thw) = oracle(variant, case, "image_grid_thw");
    (
        pv.iter().map(|&v| v as f32).collect(),
        thw.chunks_exact(3)
            .map(|g| [g[0] as usize, g[1] as usize, g[2] as usize])
            .collect(),
    )
}

#[test]
fn encode_host_returns_each_images_rows_in_order() {
    for (variant, case) in [
        ("glm5_next", "batch2"),
        ("glm_ocr", "batch2"),
        ("glm5_next", "video_t2"),
    ] {
        let t = tower(variant);
        let (pv, grids) = inputs(variant, case);
        let images = tower_glm5::split_images(t.config(), &pv, &grids).expect("split");
        let rows = t.encode_host(&images).expect("encode");
        let (shape, want) = oracle(variant, case, "f64/rows");
        assert_eq!(shape[1], t.config().text_hidden);
        assert_eq!(rows.len(), grids.len());
        let mut start = 0;
        for (r, g) in rows.iter().zip(&grids) {
            let n = g[0] * g[1] * g[2] / 4 * shape[1];
            assert_eq!(r.len(), n, "{variant}/{case}: rows of {g:?}");
            let got: Vec<f64> = r.iter().map(|&v| v as f64).collect();
            let rel = rel_l2(&got, &want[start..start + n]);
            assert!(rel < 1e-5, "{variant}/{case} image {g:?}: rel-L2 {rel:e}");
            start += n;
        }
        assert_eq!(start, want.len());
    }
}

/// seed003 feeds the post-norm rows `[N, H]` to the downsample GEMM as `[N/4, 4H]`, i.e. each
/// row gathered (ky, kx, c), against the Conv2d weight `[O, H, 2, 2]` flattened (c, ky, kx).
/// Upstream's `view(−1, 2, 2, H).permute(0, 3, 1, 2)` + Conv2d is the (c, ky, kx) gather.
#[test]
fn downsample_gathers_c_ky_kx_and_the_seed003_order_is_wrong() {
    for (variant, case) in [("glm_ocr", "tiny_20x15"), ("glm5_next", "batch2")] {
        let t = tower(variant);
        let (h, o) = (t.config().hidden, t.config().text_hidden);
        let (_, post) = oracle(variant, case, "f64/post_norm");
        let (_, want) = oracle(variant, case, "f64/downsample");
        let post: Vec<f32> = post.iter().map(|&v| v as f32).collect();
        let n = post.len() / h;
        let ds = &t.weights.downsample;
        let run = |x: &[f32]| -> Vec<f64> {
            host::gemm(x, &ds.w, ds.b.as_deref(), n / 4, o, 4 * h)
                .into_iter()
                .map(f64::from)
                .collect()
        };
        let right = rel_l2(&run(&host::block_gather_2x2(&post, n, h, None)), &want);
        let seed003 = rel_l2(&run(&post), &want);
        assert!(right < 1e-6, "{variant}: (c, ky, kx) rel-L2 {right:e}");
        assert!(seed003 > 0.1, "{variant}: (ky, kx, c) rel-L2 {seed003:e}");
        println!("{variant}/{case}: (c,ky,kx) {right:.2e}, seed003 (ky,kx,c) {seed003:.2e}");
    }
}

#[test]
fn positions_are_block_major_and_repeat_per_frame() {
    // vision_utils.get_vision_position_ids for grid (1, 2, 4), m = 2: h ids [0,0,1,1, 0,0,1,1],
    // w ids [0,1,0,1, 2,3,2,3]; returned as (x = w, y = h) pairs.
    let p = vision_positions([1, 2, 4], 2);
    let xy: Vec<(i32, i32)> = p.chunks_exact(2).map(|c| (c[0], c[1])).collect();
    assert_eq!(
        xy,
        [
            (0, 0),
            (1, 0),
            (0, 1),
            (1, 1),
            (2, 0),
            (3, 0),
            (2, 1),
            (3, 1)
        ]
    );
    let p2 = vision_positions([2, 2, 4], 2);
    assert_eq!(p2.len(), 2 * p.len());
    assert_eq!(&p2[..p.len()], &p[..]);
    assert_eq!(&p2[p.len()..], &p[..]);
}

#[test]
fn one_segment_per_temporal_patch() {
    // get_vision_cu_seqlens(merge_temporal=False): repeat_interleave(h·w, t)
    assert_eq!(
        vision_cu_seqlens(&[[2, 8, 8], [1, 2, 4]]).expect("cu"),
        [0, 64, 128, 136]
    );
}

#[test]
fn inconsistent_inputs_are_typed_errors() {
    let t = tower("glm_ocr");
    let c = t.config();
    let pd = c.patch_dim();
    let pv = vec![0.1f32; 16 * pd];
    // rows do not add up
    assert!(matches!(
        tower_glm5::split_images(c, &pv, &[[1, 2, 2]]),
        Err(GlmError::Input(_))
    ));
    assert!(matches!(
        tower_glm5::split_images(c, &pv, &[[1, 4, 8]]),
        Err(GlmError::Input(_))
    ));
    assert!(matches!(
        tower_glm5::split_images(c, &pv, &[[usize::MAX, 4, 4]]),
        Err(GlmError::Input(_))
    ));
    // odd grid (not a multiple of the merge)
    let odd = GlmImage {
        patches: &pv[..15 * pd],
        grid_thw: [1, 3, 5],
    };
    assert!(matches!(t.encode_host(&[odd]), Err(GlmError::Input(_))));
    // wrong row width
    let short = GlmImage {
        patches: &pv[..16 * pd - 1],
        grid_thw: [1, 4, 4],
    };
    assert!(matches!(t.encode_host(&[short]), Err(GlmError::Input(_))));
    // non-finite pixel
    let mut nan = pv.clone();
    nan[7] = f32::NAN;
    let img = GlmImage {
        patches: &nan,
        grid_thw: [1, 4, 4],
    };
    assert!(matches!(t.encode_host(&[img]), Err(GlmError::Input(_))));
    // empty grid
    let empty = GlmImage {
        patches: &[],
        grid_thw: [0, 4, 4],
    };
    assert!(matches!(t.encode_host(&[empty]), Err(GlmError::Input(_))));
    // no images: no rows
    assert!(t.encode_host(&[]).expect("empty batch").is_empty());
    // a good one: 4 rows of O
    let ok = GlmImage {
        patches: &pv,
        grid_thw: [1, 4, 4],
    };
    let rows = t.encode_host(&[ok]).expect("runs");
    assert_eq!(rows[0].len(), 4 * c.text_hidden);
    assert!(rows[0].iter().all(|v| v.is_finite()));
}
