//! Host checks of the device path's planning and weight transforms, and its op sequence
//! emulated on the host against the reference.

use super::*;
use crate::config::NUM_CHANNELS;
use crate::forward::{patchify, validate_images, Grid, StepView};
use gpu_core::host;
use gpu_core::HostSource;
use std::borrow::Cow;

/// A downsampler weight `[O, C·9]` in the layout the precision's im2col produces: bf16 and f16
/// as the checkpoint has it (gpu-core's im2col, columns (c, ky, kx)); f32 columns (ky, kx, c)
/// ([`im2col_plan`]).
fn conv_layout(p: Precision, w: &[f32], c: usize) -> Cow<'_, [f32]> {
    match p {
        Precision::Bf16 | Precision::F16 => Cow::Borrowed(w),
        Precision::F32 => Cow::Owned(taps_major(w, c, CONV_TAPS)),
    }
}

fn vals(n: usize, seed: u32) -> Vec<f32> {
    gpu_core::host::test_values(n, seed)
}

/// Crop views of image 0, one per `(gh, gw)` of `sizes` over the matching plane of `planes`, with
/// sides of `p`-pixel patches.
fn crop_grids<'a>(sizes: &[(usize, usize)], planes: &'a [Vec<f32>], p: usize) -> Vec<Grid<'a>> {
    sizes
        .iter()
        .zip(planes)
        .map(|(&(gh, gw), px)| Grid {
            view: StepView {
                pixels: px,
                height: gh * p,
                width: gw * p,
            },
            image: 0,
            local: true,
            gh,
            gw,
        })
        .collect()
}

/// The one-pass patch rows equal patchify, then the column padding, then the precision, for
/// views of several grids in a permuted order, in both precisions.
#[test]
fn patch_rows_equal_patchify_then_pad() {
    let p = 3;
    let sizes = [(4, 5), (2, 2), (6, 3), (4, 5)];
    let planes: Vec<Vec<f32>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &(gh, gw))| vals(NUM_CHANNELS * gh * p * gw * p, 7 + i as u32))
        .collect();
    let grids = crop_grids(&sizes, &planes, p);
    let order = [2, 0, 3, 1];
    let mut flat = Vec::new();
    for &i in &order {
        patchify(&grids[i], p, &mut flat);
    }
    let pd = NUM_CHANNELS * p * p;
    let want = pad_cols(&flat, pd);
    let k = pd.next_multiple_of(8);
    assert!(k > pd, "the case pads");
    assert_eq!(
        patch_rows(&grids, &order, p, k, |x| x, |n| vec![0.0; n]),
        (want.clone(), None)
    );
    // Every element is written, the padding columns too, whatever the buffer held.
    assert_eq!(
        patch_rows(&grids, &order, p, k, |x| x, |n| vec![7.0; n]),
        (want.clone(), None)
    );
    let want_bf16: Vec<bf16> = want.iter().map(|&x| bf16::from_f32(x)).collect();
    // a kept buffer that held other values is zeroed where the padding columns are
    drop(HostGemm::Bf16(vec![
        bf16::from_f32(9.0);
        want_bf16.len() + 3
    ]));
    assert_eq!(
        patch_rows(
            &grids,
            &order,
            p,
            k,
            bf16::from_f32,
            gpu_core::recycled_bf16
        ),
        (want_bf16, None)
    );
}

/// `prepare_host` checks the values while it converts them, and refuses exactly what the host
/// path's checks refuse, with the same message: the first bad view in upstream order (crops,
/// then the global view, image by image), whatever the device order groups together, a NaN or
/// an infinity before a later shape error, a shape error before a later NaN, a NaN outside the
/// patch grid (a side not a multiple of the patch), and a NaN before the newline flags' check.
#[test]
fn prepare_host_refuses_what_the_host_checks_refuse() {
    let t = fixture_tower();
    let c = &t.config;
    let p = c.patch;
    // Views of 2×2 and 3×2 patches, and one of 2×2 patches with 5 pixel rows and 3 columns
    // past them (never read by the patch rows).
    let sq = vals(NUM_CHANNELS * 4 * p * p, 3);
    let wide = vals(NUM_CHANNELS * 6 * p * p, 4);
    let (oh, ow) = (2 * p + 5, 2 * p + 3);
    let odd = vals(NUM_CHANNELS * oh * ow, 5);
    let view = |px: &'static [f32], h: usize, w: usize| StepView {
        pixels: px,
        height: h,
        width: w,
    };
    let leak = |mut v: Vec<f32>, at: Option<(usize, f32)>| -> &'static [f32] {
        if let Some((i, x)) = at {
            v[i] = x;
        }
        Box::leak(v.into_boxed_slice())
    };
    let good_sq = leak(sq.clone(), None);
    let good_wide = leak(wide.clone(), None);
    let good_odd = leak(odd.clone(), None);
    let nan_sq = leak(sq.clone(), Some((sq.len() - 1, f32::NAN)));
    let inf_wide = leak(wide.clone(), Some((7, f32::NEG_INFINITY)));
    // The last value of the last pixel row: past the patch grid on both axes.
    let nan_odd_outside = leak(odd.clone(), Some((odd.len() - 1, f32::NAN)));
    let nan_odd_inside = leak(odd.clone(), Some((0, f32::INFINITY)));
    let image = |crops: Vec<StepView<'static>>, global: StepView<'static>| StepImage {
        newline_mask: vec![false; crops.len()],
        crops,
        global,
    };
    let s = |px| view(px, 2 * p, 2 * p);
    let w = |px| view(px, 2 * p, 3 * p);
    let o = |px| view(px, oh, ow);
    let short = view(&good_sq[1..], 2 * p, 2 * p);
    let mut no_flags = image(vec![s(good_sq), s(good_sq)], w(with_last_nan(&wide)));
    no_flags.newline_mask.pop();
    let cases: Vec<(&str, Vec<StepImage<'static>>)> = vec![
        (
            "all good",
            vec![
                image(vec![s(good_sq), w(good_wide)], o(good_odd)),
                image(vec![], s(good_sq)),
            ],
        ),
        (
            "NaN in image 0's second crop",
            vec![image(vec![s(good_sq), s(nan_sq)], w(good_wide))],
        ),
        (
            "NaN in image 1's global view, grouped first on the device",
            vec![
                image(vec![w(good_wide)], w(good_wide)),
                image(vec![w(good_wide)], s(nan_sq)),
            ],
        ),
        (
            "inf in image 0's global view before image 1's short crop",
            vec![
                image(vec![s(good_sq)], w(inf_wide)),
                image(vec![short], s(good_sq)),
            ],
        ),
        (
            "a short crop before a NaN",
            vec![image(vec![short, s(good_sq)], s(nan_sq))],
        ),
        (
            "NaN outside the patch grid",
            vec![image(vec![s(good_sq)], o(nan_odd_outside))],
        ),
        (
            "inf inside the patch grid of an uneven view, after a NaN in a crop",
            vec![image(vec![s(good_sq), s(nan_sq)], o(nan_odd_inside))],
        ),
        (
            "inf inside an uneven view's grid",
            vec![image(vec![s(good_sq)], o(nan_odd_inside))],
        ),
        ("NaN before the newline flags' check", vec![no_flags]),
        (
            "newline flags before a later NaN",
            vec![
                {
                    let mut i = image(vec![s(good_sq)], s(good_sq));
                    i.newline_mask.clear();
                    i
                },
                image(vec![], s(nan_sq)),
            ],
        ),
    ];
    for (what, images) in &cases {
        let want = validate_images(c, images)
            .map(|_| ())
            .map_err(|e| e.to_string());
        for prec in [Precision::Bf16, Precision::F16, Precision::F32] {
            let got = StepCuda::prepare_host(c, prec, images)
                .map(|_| ())
                .map_err(|e| e.to_string());
            match (&got, &want) {
                (Ok(()), Ok(())) => {}
                (Err(g), Err(w)) => assert!(g.contains(w.as_str()), "{what} {prec:?}: {g} / {w}"),
                _ => panic!("{what} {prec:?}: {got:?} against the host's {want:?}"),
            }
        }
        assert_eq!(want.is_ok(), *what == "all good", "{what}: {want:?}");
    }
}

/// A 2×3-patch view's values with a NaN at the end (the global view of the newline case).
fn with_last_nan(wide: &[f32]) -> &'static [f32] {
    let mut v = wide.to_vec();
    if let Some(x) = v.last_mut() {
        *x = f32::NAN;
    }
    Box::leak(v.into_boxed_slice())
}

/// `patch_rows` names the first view in upstream order that holds a non-finite value, not the
/// first in device order.
#[test]
fn patch_rows_name_the_first_bad_view_upstream() {
    let p = 2;
    let sizes = [(2, 2), (1, 3), (2, 2)];
    let mut planes: Vec<Vec<f32>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &(gh, gw))| vals(NUM_CHANNELS * gh * p * gw * p, 11 + i as u32))
        .collect();
    planes[2][3] = f32::NAN;
    planes[1][0] = f32::INFINITY;
    let grids = crop_grids(&sizes, &planes, p);
    // Device order puts view 2 (a 2×2 grid, as view 0) before view 1.
    let (_, bad) = patch_rows(&grids, &[0, 2, 1], p, 16, |x| x, |n| vec![0.0; n]);
    assert_eq!(bad, Some(1));
    let (_, bad) = patch_rows(&grids[..1], &[0], p, 16, |x| x, |n| vec![0.0; n]);
    assert_eq!(bad, None);
}

/// The f32 im2col plan with the (ky, kx, c) weight gives the host twin's im2col with the
/// checkpoint's (c, ky, kx) weight, and writes every element (the output starts as NaN).
#[test]
fn im2col_plan_matches_the_host_twin() {
    for (views, gh, gw, c) in [
        (1, 12, 12, 5),
        (2, 8, 8, 3),
        (3, 6, 6, 4),
        (2, 5, 7, 2),
        (1, 3, 3, 3),
        (2, 1, 1, 2),
        (1, 2, 1, 3),
        (1, 1, 4, 2),
    ] {
        let lead = 3; // tokens before the run in the source buffer
        let src = vals((lead + views * gh * gw) * c, 11);
        let (oh, ow) = (conv3x3s2_out(gh), conv3x3s2_out(gw));
        let m = views * oh * ow;
        let mut col = vec![f32::NAN; m * CONV_TAPS * c];
        for p in im2col_plan(views, gh, gw, c, lead) {
            for r in 0..p.rows {
                let dst = p.dst + r * CONV_TAPS * c;
                match p.src {
                    Some((off, ld)) => {
                        col[dst..dst + c].copy_from_slice(&src[off + r * ld..off + r * ld + c])
                    }
                    None => col[dst..dst + c].fill(0.0),
                }
            }
        }
        assert!(
            col.iter().all(|v| v.is_finite()),
            "{views}×{gh}×{gw}: unwritten"
        );
        let want_col = host::im2col_3x3s2(&src[lead * c..], views, gh, gw, c);
        let o = 4;
        let w = vals(o * CONV_TAPS * c, 5);
        let want = host::gemm(&want_col, &w, None, m, o, CONV_TAPS * c);
        let got = host::gemm(
            &col,
            &taps_major(&w, c, CONV_TAPS),
            None,
            m,
            o,
            CONV_TAPS * c,
        );
        for (a, b) in got.iter().zip(&want) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{views}×{gh}×{gw}×{c}: {a} vs {b}"
            );
        }
    }
}

fn fixture_tower() -> crate::StepTower {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/step3p7");
    let ck = st_reader::Checkpoint::open(dir).expect("fixture checkpoint");
    crate::StepTower::from_checkpoint(&ck).expect("fixture tower")
}

/// `run_in`'s op sequence on the host twins, with the device layouts of `precision` (padded
/// heads and the checkpoint's conv columns for bf16; permuted conv columns and the im2col
/// plan for f32) and the batch's device order, views split back as `run_in` does.
fn emulate(
    t: &crate::StepTower,
    images: &[StepImage<'_>],
    p: Precision,
) -> (Vec<StepRows>, StepStages) {
    let (c, w) = (&t.config, &t.weights);
    let (h, heads, hd, inner) = (c.hidden, c.heads, c.head_dim, c.intermediate);
    let kd = gpu_core::attention_head_dim(p, hd).unwrap();
    let wp = heads * kd;
    let eps = c.eps as f32;
    let grids = validate_images(c, images).unwrap();
    let plan = ViewPlan::new(&grids).unwrap();
    let (mut pixels, mut pos) = (Vec::new(), Vec::new());
    for &i in &plan.order {
        patchify(&grids[i], c.patch, &mut pixels);
        pos.extend(grid_positions(grids[i].gh, grids[i].gw));
    }
    let cu = plan.cu_seqlens();
    let n = plan.n;
    let ts = c.pos_side;
    let mut y = vec![0.0f32; n * h];
    for v in &plan.views {
        let table = if (v.gh, v.gw) == (ts, ts) {
            w.pos.clone()
        } else {
            host::bilinear_resize(&w.pos, ts, ts, v.gh, v.gw, h)
        };
        y[v.tok * h..(v.tok + v.tokens()) * h].copy_from_slice(&table);
    }
    let pk = patch_k(c);
    let pixels = pad_cols(&pixels, c.patch_dim());
    let pe = host::gemm(&pixels, &pad_cols(&w.patch, c.patch_dim()), None, n, h, pk);
    y.iter_mut().zip(&pe).for_each(|(a, b)| *a += b);
    let mut st = HostStages {
        patch_embed: y.clone(),
        ..HostStages::default()
    };
    let mut x = host::layer_norm(&y, h, Some(&w.ln_pre_w), Some(&w.ln_pre_b), eps);
    st.pre_ln = x.clone();
    let inv = rope_inv_freq(hd, c.rope_theta);
    let add = |x: &mut Vec<f32>, y: Vec<f32>| x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
    for (li, l) in w.layers.iter().enumerate() {
        let hl = HostLayer::new(c, l, kd);
        let hn = host::layer_norm(&x, h, Some(&l.ln1_w), Some(&l.ln1_b), eps);
        let qkv_w = hl.qkv.clone().unwrap_or_else(|| l.qkv_w.clone());
        let mut qkv = host::gemm(&hn, &qkv_w, Some(&hl.qkv_b), n, 3 * wp, h);
        for (off, nh) in gpu_core::head_groups(heads, hd, kd) {
            host::qk_norm_rope(
                &mut qkv,
                n,
                nh,
                hd,
                3 * wp,
                [off, wp + off, 2 * wp + off],
                [None, None],
                [false; 3],
                eps,
                [Clamp::NONE; 3],
                Some((w.layout.rope(), &pos, &inv)),
            );
        }
        let a = host::attention(
            &qkv,
            &qkv,
            &qkv,
            3 * wp,
            [0, wp, 2 * wp],
            heads,
            kd,
            &cu,
            attention_scale(hd),
        );
        let out_w = hl.out.clone().unwrap_or_else(|| {
            ScaledRows {
                src: &l.out_w,
                scale: &hl.ls1,
                cols: h,
            }
            .to_f32_vec()
        });
        add(&mut x, host::gemm(&a, &out_w, Some(&hl.out_b), n, h, wp));
        let hn = host::layer_norm(&x, h, Some(&l.ln2_w), Some(&l.ln2_b), eps);
        let f = host::gemm(&hn, &l.fc1_w, Some(&l.fc1_b), n, inner, h);
        let f = host::act(&f, c.activation, Clamp::NONE, Clamp::NONE);
        let fc2_w = ScaledRows {
            src: &l.fc2_w,
            scale: &hl.ls2,
            cols: inner,
        }
        .to_f32_vec();
        add(&mut x, host::gemm(&f, &fc2_w, Some(&hl.fc2_b), n, h, inner));
        if li == 0 {
            st.block_0 = x.clone();
        }
    }
    st.blocks_out = x.clone();
    let (dw1, dw2) = (
        conv_layout(p, &w.down1_w, h),
        conv_layout(p, &w.down2_w, 2 * h),
    );
    let im2col = |src: &[f32], views, gh, gw, ch, tok| -> Vec<f32> {
        match p {
            Precision::Bf16 | Precision::F16 => {
                host::im2col_3x3s2(&src[tok * ch..], views, gh, gw, ch)
            }
            Precision::F32 => {
                let m = views * conv3x3s2_out(gh) * conv3x3s2_out(gw);
                let mut col = vec![f32::NAN; m * CONV_TAPS * ch];
                for q in im2col_plan(views, gh, gw, ch, tok) {
                    for r in 0..q.rows {
                        let dst = q.dst + r * CONV_TAPS * ch;
                        match q.src {
                            Some((o, ld)) => col[dst..dst + ch]
                                .copy_from_slice(&src[o + r * ld..o + r * ld + ch]),
                            None => col[dst..dst + ch].fill(0.0),
                        }
                    }
                }
                col
            }
        }
    };
    st.d1 = vec![0.0; plan.n1 * 2 * h];
    st.d2 = vec![0.0; plan.n2 * 4 * h];
    for r in &plan.runs {
        let v0 = plan.views[r.first];
        let (h1, w1) = (conv3x3s2_out(r.gh), conv3x3s2_out(r.gw));
        let (h2, w2) = (conv3x3s2_out(h1), conv3x3s2_out(w1));
        let (m1, m2) = (r.views * h1 * w1, r.views * h2 * w2);
        let col = im2col(&x, r.views, r.gh, r.gw, h, v0.tok);
        let d1 = host::gemm(&col, &dw1, Some(&w.down1_b), m1, 2 * h, 9 * h);
        st.d1[v0.r1 * 2 * h..(v0.r1 + m1) * 2 * h].copy_from_slice(&d1);
        let col = im2col(&d1, r.views, h1, w1, 2 * h, 0);
        let d2 = host::gemm(&col, &dw2, Some(&w.down2_b), m2, 4 * h, 18 * h);
        st.d2[v0.r2 * 4 * h..(v0.r2 + m2) * 4 * h].copy_from_slice(&d2);
    }
    // The projector as `project` runs it: one GEMM per piece, written in upstream order.
    let t_w = c.text_hidden;
    let mut all = vec![f32::NAN; plan.n2 * t_w];
    for (src, rows, dst) in plan.out_pieces() {
        let piece = host::gemm(
            &st.d2[src * 4 * h..(src + rows) * 4 * h],
            &w.proj,
            w.proj_b.as_deref(),
            rows,
            t_w,
            4 * h,
        );
        all[dst * t_w..(dst + rows) * t_w].copy_from_slice(&piece);
    }
    let masks: Vec<Vec<bool>> = images.iter().map(|i| i.newline_mask.clone()).collect();
    let rows = plan.split_rows(&all, c.text_hidden, &masks);
    let flat = rows.iter().flat_map(|r| r.rows.iter().copied()).collect();
    (rows, st.assemble(&plan, h, flat))
}

/// The device op sequence (run on the host twins with the device layouts and order) gives
/// the host reference's rows and stages, in both precisions' layouts, on a batch whose views
/// must be regrouped (crops of two images around a global-only image of another grid).
#[test]
fn device_sequence_matches_the_host_reference() {
    let t = fixture_tower();
    let px = |n: usize, seed: u32| vals(n, seed).iter().map(|v| 2.0 * v).collect::<Vec<f32>>();
    let crops: Vec<Vec<f32>> = (0..5).map(|i| px(3 * 112 * 112, 20 + i)).collect();
    let (g0, g1, g2) = (
        px(3 * 168 * 168, 1),
        px(3 * 140 * 126, 2),
        px(3 * 168 * 168, 3),
    );
    fn view(p: &[f32], height: usize, width: usize) -> crate::StepView<'_> {
        crate::StepView {
            pixels: p,
            height,
            width,
        }
    }
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
    let (want, ws) = t.forward_host(&images, true).unwrap();
    let ws = ws.unwrap();
    for p in [Precision::Bf16, Precision::F16, Precision::F32] {
        let (got, gs) = emulate(&t, &images, p);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(
                (&g.crop_rows, g.global_rows, &g.newline_mask),
                (&w.crop_rows, w.global_rows, &w.newline_mask)
            );
            let r = host::rel_l2(&g.rows, &w.rows);
            assert!(r < 1e-5, "{p:?} rows rel-L2 {r}");
        }
        for (kind, a, b) in [
            ("global", &gs.global, &ws.global),
            ("local", &gs.local, &ws.local),
        ] {
            for ((name, x), (_, y)) in a.named().iter().zip(b.named()) {
                assert_eq!(x.len(), y.len(), "{p:?} {kind}/{name} length");
                let r = host::rel_l2(x, y);
                assert!(r < 1e-5, "{p:?} {kind}/{name} rel-L2 {r}");
            }
        }
        assert!(host::rel_l2(&gs.rows, &ws.rows) < 1e-5);
    }
}

/// Scaling rows as they are read gives the f32 products of `scale_rows`, and rounds them
/// to the same bf16, on ranges that straddle rows.
#[test]
fn scaled_rows_read_what_scale_rows_computes() {
    let (rows, cols) = (7, 13);
    let w = vals(rows * cols, 8);
    let ls = vals(rows, 9);
    let want = scale_rows(&w, &ls, cols);
    let s = ScaledRows {
        src: &w,
        scale: &ls,
        cols,
    };
    assert_eq!(s.to_f32_vec(), want);
    for (start, n) in [(0, rows * cols), (5, 30), (12, 1), (13, 13), (40, 51)] {
        let mut b = vec![gpu_core::bf16::ZERO; n];
        s.read_bf16(start, &mut b);
        let wb: Vec<_> = want[start..start + n]
            .iter()
            .map(|&v| gpu_core::bf16::from_f32(v))
            .collect();
        assert_eq!(b, wb, "{start}+{n}");
    }
}

/// `λ ⊙ (a·Wᵀ + b)` = `a·(λ ⊙ W)ᵀ + λ ⊙ b`: the LayerScale fold.
#[test]
fn layer_scale_folds_into_the_linear() {
    let (n, inp, out) = (5, 7, 6);
    let a = vals(n * inp, 1);
    let w = vals(out * inp, 2);
    let bias = vals(out, 3);
    let ls = vals(out, 4);
    let y = host::gemm(&a, &w, Some(&bias), n, out, inp);
    let folded = host::gemm(
        &a,
        &scale_rows(&w, &ls, inp),
        Some(&hadamard(&bias, &ls)),
        n,
        out,
        inp,
    );
    for t in 0..n {
        for o in 0..out {
            let want = ls[o] * y[t * out + o];
            let got = folded[t * out + o];
            assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0));
        }
    }
}
