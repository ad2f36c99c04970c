//! Device-vs-host parity tests of the norms and activations on strided layouts (row strides,
//! offsets, column blocks of wider buffers): every element outside the written block must be left
//! untouched. Each needs a CUDA device: `cargo xtask gpu-test` runs them.
use crate::gpu_tests::{check, dev, from_bf, round_bf, to_bf, Rng};
use crate::host;
use crate::*;

/// Rows `[rows, cols]` of a strided matrix (`ld`, `offset`) as a dense vector.
fn gather(v: &[f32], rows: usize, cols: usize, ld: usize, offset: usize) -> Vec<f32> {
    (0..rows)
        .flat_map(|i| v[offset + i * ld..offset + i * ld + cols].to_vec())
        .collect()
}

/// Whether every element outside the strided matrix is still NaN (nothing written outside it).
fn untouched_outside(v: &[f32], rows: usize, cols: usize, ld: usize, offset: usize) -> bool {
    v.iter().enumerate().all(|(i, x)| {
        let inside = i >= offset && (i - offset) / ld < rows && (i - offset) % ld < cols;
        inside || x.is_nan()
    })
}

/// The norm kernels' other launch shapes: rows held by 2, 4 or 8 warps (widths past 1536, up to
/// MAX_NORM_WIDTH), the element-wise fallback (widths, strides or offsets not multiples of 4), strided
/// aligned rows on the vector path, clamps with lo > 0 (padding must not enter the statistics),
/// weightless and biasless calls; outputs NaN-poisoned and checked untouched outside the matrix.
#[test]
#[ignore = "needs a CUDA device"]
fn norm_layouts_match_host() {
    let d = dev();
    let mut r = Rng::new(11);
    // (rows, h, ldx, x offset, ldy, y offset)
    let cases = [
        (5usize, 1001usize, 1001usize, 0usize, 1001usize, 0usize),
        (9, 1152, 1155, 3, 1157, 1),
        (7, 1536, 1540, 4, 1544, 8),
        (6, 2000, 2000, 0, 2000, 0),
        (4, 3001, 3003, 1, 3001, 0),
        (3, 7000, 7000, 0, 7004, 4),
        (2, MAX_NORM_WIDTH, MAX_NORM_WIDTH, 0, MAX_NORM_WIDTH, 0),
        (17, 100, 104, 4, 100, 2),
        (1000, 1024, 1024, 0, 1024, 0),
    ];
    for (rows, h, ldx, xo, ldy, yo) in cases {
        let xs: Vec<f32> = r
            .vec(xo + rows * ldx, 3.0)
            .iter()
            .map(|v| v + 0.7)
            .collect();
        let x = gather(&xs, rows, h, ldx, xo);
        let (w, b) = (r.vec(h, 1.5), r.vec(h, 0.5));
        let (xd, wd, bd) = (
            d.upload(&xs).unwrap(),
            d.upload(&w).unwrap(),
            d.upload(&b).unwrap(),
        );
        let (xm, ym) = (
            Mat::strided(rows, h, ldx, xo),
            Mat::strided(rows, h, ldy, yo),
        );
        let ylen = yo + rows * ldy;
        let tag = format!("{rows}x{h} x({ldx},+{xo}) y({ldy},+{yo})");
        let clamp = Clamp::new(0.05, 1.2);
        for weighted in [true, false] {
            let wo = weighted.then_some(&wd);
            let wh = weighted.then_some(w.as_slice());
            let mut yf = d.alloc::<f32>(ylen).unwrap();
            d.fill(&mut yf, f32::NAN).unwrap();
            d.rms_norm(&xd, xm, wo, &mut yf, ym, 1e-6, clamp).unwrap();
            let got = d.download(&yf).unwrap();
            check(
                &format!("rms_norm f32 {tag} w{weighted}"),
                &gather(&got, rows, h, ldy, yo),
                &host::rms_norm(&x, h, wh, 1e-6, clamp),
                1e-6,
            );
            assert!(
                untouched_outside(&got, rows, h, ldy, yo),
                "rms_norm f32 {tag}: wrote outside"
            );
            let mut yb = d.alloc::<bf16>(ylen).unwrap();
            d.fill(&mut yb, bf16::NAN).unwrap();
            d.rms_norm(&xd, xm, wo, &mut yb, ym, 1e-5, Clamp::NONE)
                .unwrap();
            let got = from_bf(&d.download(&yb).unwrap());
            check(
                &format!("rms_norm bf16 {tag} w{weighted}"),
                &gather(&got, rows, h, ldy, yo),
                &host::rms_norm(&x, h, wh, 1e-5, Clamp::NONE),
                4e-3,
            );
            assert!(
                untouched_outside(&got, rows, h, ldy, yo),
                "rms_norm bf16 {tag}: wrote outside"
            );
            let bo = weighted.then_some(&bd);
            let bh = weighted.then_some(b.as_slice());
            d.fill(&mut yf, f32::NAN).unwrap();
            d.layer_norm(&xd, xm, wo, bo, &mut yf, ym, 1e-5).unwrap();
            let got = d.download(&yf).unwrap();
            check(
                &format!("layer_norm f32 {tag} w{weighted}"),
                &gather(&got, rows, h, ldy, yo),
                &host::layer_norm(&x, h, wh, bh, 1e-5),
                1e-6,
            );
            assert!(
                untouched_outside(&got, rows, h, ldy, yo),
                "layer_norm f32 {tag}: wrote outside"
            );
            d.fill(&mut yb, bf16::NAN).unwrap();
            d.layer_norm(&xd, xm, wo, bo, &mut yb, ym, 1e-5).unwrap();
            let got = from_bf(&d.download(&yb).unwrap());
            check(
                &format!("layer_norm bf16 {tag} w{weighted}"),
                &gather(&got, rows, h, ldy, yo),
                &host::layer_norm(&x, h, wh, bh, 1e-5),
                4e-3,
            );
            assert!(
                untouched_outside(&got, rows, h, ldy, yo),
                "layer_norm bf16 {tag}: wrote outside"
            );
        }
        // gemma sandwich with a strided y (the x stream is dense), with and without the next norm
        for next in [true, false] {
            let x0 = r.vec(rows * h, 2.0);
            let mut xr = d.upload(&x0).unwrap();
            let mut nxt = d.alloc::<bf16>(rows * h).unwrap();
            d.fill(&mut nxt, bf16::NAN).unwrap();
            let c = Clamp::new(0.1, 1.5);
            d.residual_rms_add(
                &mut xr,
                &xd,
                xm,
                Some(&wd),
                1e-6,
                c,
                next.then_some((Some(&bd), &mut nxt, 1e-6)),
            )
            .unwrap();
            let mut want = x0.clone();
            let wn = host::residual_rms_add(
                &mut want,
                &x,
                h,
                Some(&w),
                1e-6,
                c,
                next.then_some((Some(b.as_slice()), 1e-6)),
            );
            check(
                &format!("residual_rms_add x {tag} next{next}"),
                &d.download(&xr).unwrap(),
                &want,
                1e-6,
            );
            let got = from_bf(&d.download(&nxt).unwrap());
            match wn {
                Some(wn) => check(&format!("residual_rms_add next {tag}"), &got, &wn, 4e-3),
                None => assert!(
                    got.iter().all(|v| v.is_nan()),
                    "next_out written without next"
                ),
            }
        }
    }
}

/// gated_act / act on the vector path and on the element-wise fallback: f32 dense (vector), bf16
/// widths and offsets that are not multiples of 8 (fallback), one chunk per row, strided outputs.
/// The one-warp entries (`*_w9`, `*_w12`: dense aligned rows up to 1536 wide) against the generic
/// entries' element-wise path (the same rows at an odd offset and stride): the same arithmetic in the
/// same order, so bitwise equal outputs, for rms_norm, layer_norm and residual_rms_add with its next
/// pre-norm, in f32, bf16 and f16, at widths with full and partial last chunks on both entries
/// (1152 and 1536 the towers' widths) and with more rows than one wave of the SMs holds.
#[test]
#[ignore = "needs a CUDA device"]
fn one_warp_norm_entries_equal_the_generic_bitwise() {
    let d = dev();
    let mut r = Rng::new(29);
    for (rows, h) in [
        (3usize, 72usize),
        (41, 1100),
        (2394, 1152),
        (5, 1156),
        (300, 1536),
    ] {
        let (ld, o) = (h + 1, 1);
        let xs: Vec<f32> = r.vec(o + rows * ld, 3.0).iter().map(|v| v + 0.4).collect();
        let x = gather(&xs, rows, h, ld, o);
        let (w, b) = (r.vec(h, 1.5), r.vec(h, 0.5));
        let (xs_d, x_d, wd, bd) = (
            d.upload(&xs).unwrap(),
            d.upload(&x).unwrap(),
            d.upload(&w).unwrap(),
            d.upload(&b).unwrap(),
        );
        let (dense, odd) = (Mat::dense(rows, h), Mat::strided(rows, h, ld, o));
        let tag = format!("{rows}x{h}");
        fn same(what: &str, a: &[f32], b: &[f32]) {
            let bad = a
                .iter()
                .zip(b)
                .filter(|(p, q)| p.to_bits() != q.to_bits())
                .count();
            assert_eq!(bad, 0, "{what}: {bad} of {} values differ", a.len());
        }
        // rms_norm and layer_norm into f32 and bf16 (f16 shares the bf16 entries' template)
        let mut one = d.alloc::<f32>(rows * h).unwrap();
        let mut gen = d.alloc::<f32>(o + rows * ld).unwrap();
        let mut one_b = d.alloc::<bf16>(rows * h).unwrap();
        let mut gen_b = d.alloc::<bf16>(o + rows * ld).unwrap();
        // the strided outputs' gaps are never written: NaN, so that initcheck sees them initialised
        d.fill(&mut gen, f32::NAN).unwrap();
        d.fill(&mut gen_b, bf16::NAN).unwrap();
        let clamp = Clamp::new(-2.0, 2.5);
        d.rms_norm(&x_d, dense, Some(&wd), &mut one, dense, 1e-6, clamp)
            .unwrap();
        d.rms_norm(&xs_d, odd, Some(&wd), &mut gen, odd, 1e-6, clamp)
            .unwrap();
        let g = d.download(&gen).unwrap();
        same(
            &format!("rms_norm f32 {tag}"),
            &d.download(&one).unwrap(),
            &gather(&g, rows, h, ld, o),
        );
        d.rms_norm(&x_d, dense, None, &mut one_b, dense, 1e-5, Clamp::NONE)
            .unwrap();
        d.rms_norm(&xs_d, odd, None, &mut gen_b, odd, 1e-5, Clamp::NONE)
            .unwrap();
        let g = from_bf(&d.download(&gen_b).unwrap());
        same(
            &format!("rms_norm bf16 {tag}"),
            &from_bf(&d.download(&one_b).unwrap()),
            &gather(&g, rows, h, ld, o),
        );
        d.layer_norm(&x_d, dense, Some(&wd), Some(&bd), &mut one, dense, 1e-5)
            .unwrap();
        d.layer_norm(&xs_d, odd, Some(&wd), Some(&bd), &mut gen, odd, 1e-5)
            .unwrap();
        let g = d.download(&gen).unwrap();
        same(
            &format!("layer_norm f32 {tag}"),
            &d.download(&one).unwrap(),
            &gather(&g, rows, h, ld, o),
        );
        d.layer_norm(&x_d, dense, Some(&wd), None, &mut one_b, dense, 1e-5)
            .unwrap();
        d.layer_norm(&xs_d, odd, Some(&wd), None, &mut gen_b, odd, 1e-5)
            .unwrap();
        let g = from_bf(&d.download(&gen_b).unwrap());
        same(
            &format!("layer_norm bf16 {tag}"),
            &from_bf(&d.download(&one_b).unwrap()),
            &gather(&g, rows, h, ld, o),
        );
        // residual_rms_add: y dense (one-warp entry) or at the odd stride (generic, element-wise)
        let ys: Vec<f32> = r.vec(o + rows * ld, 2.0);
        let y = gather(&ys, rows, h, ld, o);
        let (ys_d, y_d) = (d.upload(&ys).unwrap(), d.upload(&y).unwrap());
        let mut xa = d.upload(&x).unwrap();
        let mut xb = d.upload(&x).unwrap();
        let (mut na, mut nb) = (
            d.alloc::<bf16>(rows * h).unwrap(),
            d.alloc::<bf16>(rows * h).unwrap(),
        );
        let c = Clamp::new(-1.5, 1.75);
        d.residual_rms_add(
            &mut xa,
            &y_d,
            dense,
            Some(&wd),
            1e-6,
            c,
            Some((Some(&bd), &mut na, 1e-6)),
        )
        .unwrap();
        d.residual_rms_add(
            &mut xb,
            &ys_d,
            odd,
            Some(&wd),
            1e-6,
            c,
            Some((Some(&bd), &mut nb, 1e-6)),
        )
        .unwrap();
        same(
            &format!("residual_rms_add x {tag}"),
            &d.download(&xa).unwrap(),
            &d.download(&xb).unwrap(),
        );
        same(
            &format!("residual_rms_add next bf16 {tag}"),
            &from_bf(&d.download(&na).unwrap()),
            &from_bf(&d.download(&nb).unwrap()),
        );
        let (mut fa, mut fb) = (
            d.alloc::<f16>(rows * h).unwrap(),
            d.alloc::<f16>(rows * h).unwrap(),
        );
        d.residual_rms_add_f16(
            &mut xa,
            &y_d,
            dense,
            None,
            1e-6,
            c,
            Some((None, &mut fa, 1e-6)),
        )
        .unwrap();
        d.residual_rms_add_f16(
            &mut xb,
            &ys_d,
            odd,
            None,
            1e-6,
            c,
            Some((None, &mut fb, 1e-6)),
        )
        .unwrap();
        same(
            &format!("residual_rms_add_f16 x {tag}"),
            &d.download(&xa).unwrap(),
            &d.download(&xb).unwrap(),
        );
        let (fa, fb) = (d.download(&fa).unwrap(), d.download(&fb).unwrap());
        same(
            &format!("residual_rms_add_f16 next {tag}"),
            &fa.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
            &fb.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn activation_layouts_match_host() {
    let d = dev();
    let mut r = Rng::new(12);
    // (rows, cols, ldo, out offset, ld of gate|up, gate offset, up offset)
    let cases = [
        (
            33usize, 432usize, 432usize, 0usize, 864usize, 0usize, 432usize,
        ),
        (7, 1001, 1001, 0, 2002, 0, 1001),
        (7, 96, 104, 8, 200, 4, 100),
        (1001, 8, 8, 0, 16, 0, 8),
        (257, 12, 16, 4, 32, 4, 20),
        (13, 430, 433, 3, 860, 0, 430),
    ];
    let gates = [
        Gate::plain(Activation::GeluTanh),
        Gate::plain(Activation::QuickGelu),
        Gate::plain(Activation::GeluErf),
        Gate::swiglu_clamped(2.0),
        Gate {
            gate: Clamp::new(-3.0, 2.5),
            up: Clamp::new(-1.0, 4.0),
            out: Clamp::new(-2.0, 2.0),
            ..Gate::plain(Activation::Identity)
        },
    ];
    for (rows, cols, ldo, oo, ld, go, uo) in cases {
        let inlen = rows * ld + go.max(uo);
        let olen = oo + rows * ldo;
        let tag = format!("{rows}x{cols} out({ldo},+{oo}) in({ld},+{go},+{uo})");
        let (om, gm, um) = (
            Mat::strided(rows, cols, ldo, oo),
            Mat::strided(rows, cols, ld, go),
            Mat::strided(rows, cols, ld, uo),
        );
        // bf16
        let gu = round_bf(&r.vec(inlen, 6.0));
        let gud = d.upload(&to_bf(&gu)).unwrap();
        let (gate, up) = (
            gather(&gu, rows, cols, ld, go),
            gather(&gu, rows, cols, ld, uo),
        );
        for g in gates {
            let mut out = d.alloc::<bf16>(olen).unwrap();
            d.fill(&mut out, bf16::NAN).unwrap();
            d.gated_act(&mut out, om, &gud, gm, &gud, um, g).unwrap();
            let got = from_bf(&d.download(&out).unwrap());
            check(
                &format!("gated_act bf16 {tag} {:?}", g.act),
                &gather(&got, rows, cols, ldo, oo),
                &host::gated_act(&gate, &up, g),
                4e-3,
            );
            assert!(
                untouched_outside(&got, rows, cols, ldo, oo),
                "gated_act bf16 {tag}: wrote outside"
            );
        }
        let mut out = d.alloc::<bf16>(olen).unwrap();
        d.fill(&mut out, bf16::NAN).unwrap();
        d.act(
            &mut out,
            om,
            &gud,
            gm,
            Activation::QuickGelu,
            Clamp::new(-4.0, 5.0),
            Clamp::new(-3.0, 3.0),
        )
        .unwrap();
        let got = from_bf(&d.download(&out).unwrap());
        check(
            &format!("act bf16 {tag}"),
            &gather(&got, rows, cols, ldo, oo),
            &host::act(
                &gate,
                Activation::QuickGelu,
                Clamp::new(-4.0, 5.0),
                Clamp::new(-3.0, 3.0),
            ),
            4e-3,
        );
        assert!(
            untouched_outside(&got, rows, cols, ldo, oo),
            "act bf16 {tag}: wrote outside"
        );
        // f32
        let guf = r.vec(inlen, 6.0);
        let gufd = d.upload(&guf).unwrap();
        let (gate, up) = (
            gather(&guf, rows, cols, ld, go),
            gather(&guf, rows, cols, ld, uo),
        );
        for g in gates {
            let mut out = d.alloc::<f32>(olen).unwrap();
            d.fill(&mut out, f32::NAN).unwrap();
            d.gated_act(&mut out, om, &gufd, gm, &gufd, um, g).unwrap();
            let got = d.download(&out).unwrap();
            check(
                &format!("gated_act f32 {tag} {:?}", g.act),
                &gather(&got, rows, cols, ldo, oo),
                &host::gated_act(&gate, &up, g),
                1e-5,
            );
            assert!(
                untouched_outside(&got, rows, cols, ldo, oo),
                "gated_act f32 {tag}: wrote outside"
            );
        }
        // in place on the gate block: the up block must be left as it was
        let mut x = d.upload(&guf).unwrap();
        d.act_in_place(
            &mut x,
            gm,
            Activation::GeluErf,
            Clamp::NONE,
            Clamp::new(-3.0, 3.0),
        )
        .unwrap();
        let got = d.download(&x).unwrap();
        check(
            &format!("act f32 in place {tag}"),
            &gather(&got, rows, cols, ld, go),
            &host::act(
                &gate,
                Activation::GeluErf,
                Clamp::NONE,
                Clamp::new(-3.0, 3.0),
            ),
            1e-5,
        );
        assert_eq!(
            gather(&got, rows, cols, ld, uo),
            up,
            "act in place {tag}: changed the up block"
        );
    }
}
