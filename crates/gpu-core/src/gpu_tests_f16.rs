//! Device-vs-host parity tests of the f16 kernels (issue 39): norms, activations, the cast, rope,
//! the layout gathers, the GEMM and flash attention (the tier's kernels, Turing's everywhere, and
//! the 7.5 tier forced). Inputs are rounded to f16 on the host first (the values the device sees),
//! so each bound is the f16 output rounding (2⁻¹¹ relative at most) plus f32 arithmetic: an eighth
//! of the bf16 tests' bounds (bf16 rounds at 2⁻⁸). Each needs a CUDA device: `cargo xtask gpu-test`
//! runs them; without one `dev()` fails the test, never skips it.
use crate::gpu_tests::{check, dev, Rng};
use crate::host;
use crate::tier::F16Attention;
use crate::*;

/// Bound of an op whose only rounding is its f16 output (bf16's 4e-3 over 8).
const F16_OUT: f64 = 5e-4;
/// Bound of f16 attention: P rounded to f16 for the P·V product, then the f16 output (bf16's 1e-2
/// is 1.25e-3 over 8; a margin over that for P's rounding).
const F16_ATTN: f64 = 2e-3;

fn to_h(v: &[f32]) -> Vec<f16> {
    v.iter().map(|x| f16::from_f32(*x)).collect()
}
fn from_h(v: &[f16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}
/// f16-rounded copy (the values the device actually sees).
fn round_h(v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| f16::from_f32(*x).to_f32()).collect()
}
fn cols_of(v: &[f32], rows: usize, ld: usize, off: usize, cols: usize) -> Vec<f32> {
    (0..rows)
        .flat_map(|i| v[i * ld + off..i * ld + off + cols].to_vec())
        .collect()
}

/// rms_norm, layer_norm and residual_rms_add_f16's next pre-norm into f16, on the vector path (widths,
/// strides multiples of 4) and the scalar one (an odd width, a strided output at an odd offset).
#[test]
#[ignore = "needs a CUDA device"]
fn f16_norms_match_host() {
    let d = dev();
    let mut r = Rng::new(21);
    for &(rows, h) in &[
        (1usize, 72usize),
        (37, 1152),
        (513, 1536),
        (64, 4096),
        (7, 1001),
    ] {
        let x: Vec<f32> = r.vec(rows * h, 3.0).iter().map(|v| v + 0.7).collect();
        let w = r.vec(h, 1.5);
        let b = r.vec(h, 0.5);
        let xd = d.upload(&x).unwrap();
        let (wd, bd) = (d.upload(&w).unwrap(), d.upload(&b).unwrap());
        let m = Mat::dense(rows, h);
        let mut y = d.alloc::<f16>(rows * h).unwrap();
        d.fill(&mut y, f16::NAN).unwrap();
        d.rms_norm(&xd, m, Some(&wd), &mut y, m, 1e-6, Clamp::NONE)
            .unwrap();
        check(
            &format!("rms_norm f16 {rows}x{h}"),
            &from_h(&d.download(&y).unwrap()),
            &host::rms_norm(&x, h, Some(&w), 1e-6, Clamp::NONE),
            F16_OUT,
        );
        // weightless with a clamp, into a strided output (ld h + 3, offset 1: the scalar stores)
        let ldy = h + 3;
        let mut ys = d.alloc::<f16>(rows * ldy).unwrap();
        d.fill(&mut ys, f16::NAN).unwrap();
        let ym = Mat::strided(rows, h, ldy, 1);
        d.rms_norm(&xd, m, None, &mut ys, ym, 1e-5, Clamp::new(-1.0, 1.5))
            .unwrap();
        check(
            &format!("rms_norm weightless clamp f16 strided {rows}x{h}"),
            &cols_of(&from_h(&d.download(&ys).unwrap()), rows, ldy, 1, h),
            &host::rms_norm(&x, h, None, 1e-5, Clamp::new(-1.0, 1.5)),
            F16_OUT,
        );
        d.fill(&mut y, f16::NAN).unwrap();
        d.layer_norm(&xd, m, Some(&wd), Some(&bd), &mut y, m, 1e-5)
            .unwrap();
        check(
            &format!("layer_norm f16 {rows}x{h}"),
            &from_h(&d.download(&y).unwrap()),
            &host::layer_norm(&x, h, Some(&w), Some(&b), 1e-5),
            F16_OUT,
        );
        // gemma sandwich + the next pre-norm in f16; the residual stream stays f32
        let yv = r.vec(rows * h, 2.0);
        let yd = d.upload(&yv).unwrap();
        let mut xr = d.upload(&x).unwrap();
        let mut nxt = d.alloc::<f16>(rows * h).unwrap();
        d.fill(&mut nxt, f16::NAN).unwrap();
        d.residual_rms_add_f16(
            &mut xr,
            &yd,
            m,
            Some(&wd),
            1e-6,
            Clamp::new(-1.5, 1.5),
            Some((Some(&bd), &mut nxt, 1e-6)),
        )
        .unwrap();
        let mut want = x.clone();
        let wn = host::residual_rms_add(
            &mut want,
            &yv,
            h,
            Some(&w),
            1e-6,
            Clamp::new(-1.5, 1.5),
            Some((Some(&b), 1e-6)),
        )
        .unwrap();
        check(
            &format!("residual_rms_add_f16 x {rows}x{h}"),
            &d.download(&xr).unwrap(),
            &want,
            1e-6,
        );
        check(
            &format!("residual_rms_add_f16 next {rows}x{h}"),
            &from_h(&d.download(&nxt).unwrap()),
            &wn,
            F16_OUT,
        );
    }
}

/// gated_act, act (in place and out of place) and the f32 → f16 cast, on the vector path and the
/// scalar one (a strided output at an odd offset).
#[test]
#[ignore = "needs a CUDA device"]
fn f16_activations_match_host() {
    let d = dev();
    let mut r = Rng::new(22);
    let (rows, cols) = (333usize, 4304usize);
    let gu = round_h(&r.vec(rows * 2 * cols, 6.0));
    let gud = d.upload(&to_h(&gu)).unwrap();
    let gate = cols_of(&gu, rows, 2 * cols, 0, cols);
    let up = cols_of(&gu, rows, 2 * cols, cols, cols);
    let gates = [
        Gate::plain(Activation::GeluTanh),
        Gate::plain(Activation::QuickGelu),
        Gate::plain(Activation::GeluErf),
        Gate::plain(Activation::Silu),
        Gate::swiglu_clamped(2.0),
        Gate {
            gate: Clamp::new(-3.0, 2.5),
            up: Clamp::new(-1.0, 4.0),
            out: Clamp::new(-2.0, 2.0),
            ..Gate::plain(Activation::GeluTanh)
        },
    ];
    let ldo = cols + 3;
    for g in gates {
        let want = host::gated_act(&gate, &up, g);
        let mut out = d.alloc::<f16>(rows * cols).unwrap();
        d.fill(&mut out, f16::NAN).unwrap();
        d.gated_act(
            &mut out,
            Mat::dense(rows, cols),
            &gud,
            Mat::strided(rows, cols, 2 * cols, 0),
            &gud,
            Mat::strided(rows, cols, 2 * cols, cols),
            g,
        )
        .unwrap();
        check(
            &format!("gated_act f16 {g:?}"),
            &from_h(&d.download(&out).unwrap()),
            &want,
            F16_OUT,
        );
        let mut outs = d.alloc::<f16>(rows * ldo).unwrap();
        d.fill(&mut outs, f16::NAN).unwrap();
        d.gated_act(
            &mut outs,
            Mat::strided(rows, cols, ldo, 3),
            &gud,
            Mat::strided(rows, cols, 2 * cols, 0),
            &gud,
            Mat::strided(rows, cols, 2 * cols, cols),
            g,
        )
        .unwrap();
        check(
            &format!("gated_act f16 strided {g:?}"),
            &cols_of(&from_h(&d.download(&outs).unwrap()), rows, ldo, 3, cols),
            &want,
            F16_OUT,
        );
    }
    let (ci, co) = (Clamp::new(-4.0, 5.0), Clamp::new(-3.0, 3.0));
    for a in [
        Activation::QuickGelu,
        Activation::GeluErf,
        Activation::GeluTanh,
        Activation::Silu,
        Activation::Identity,
    ] {
        let want = host::act(&gate, a, ci, co);
        let mut x = d.upload(&to_h(&gate)).unwrap();
        d.act_in_place(&mut x, Mat::dense(rows, cols), a, ci, co)
            .unwrap();
        check(
            &format!("act f16 {a:?}"),
            &from_h(&d.download(&x).unwrap()),
            &want,
            F16_OUT,
        );
        let mut outs = d.alloc::<f16>(rows * ldo).unwrap();
        d.fill(&mut outs, f16::NAN).unwrap();
        d.act(
            &mut outs,
            Mat::strided(rows, cols, ldo, 3),
            &gud,
            Mat::strided(rows, cols, 2 * cols, 0),
            a,
            ci,
            co,
        )
        .unwrap();
        check(
            &format!("act f16 strided {a:?}"),
            &cols_of(&from_h(&d.download(&outs).unwrap()), rows, ldo, 3, cols),
            &want,
            F16_OUT,
        );
    }
    let xf = r.vec(1001, 3.0);
    let xd = d.upload(&xf).unwrap();
    let mut oh = d.alloc::<f16>(1001).unwrap();
    d.fill(&mut oh, f16::NAN).unwrap();
    d.cast_f32_f16(&xd, &mut oh).unwrap();
    let got = d.download(&oh).unwrap();
    // round to nearest even, as the host's f16::from_f32
    assert_eq!(got, to_h(&xf), "cast_f32_f16");
    println!("PARITY cast_f32_f16: exact");
}

/// One row of [`f16_qk_norm_rope_matches_host`]'s table: label, (tokens, heads, head_dim, row
/// stride), part offsets, normed parts, clamps, rope (layout, grid width).
type QkCaseF16<'a> = (
    &'a str,
    (usize, usize, usize, usize),
    [usize; 3],
    [bool; 3],
    [Clamp; 3],
    Option<(RopeLayout, usize)>,
);

/// One qk_norm_rope case in f16 against the host twin on the f16-rounded input (parts without work
/// must come back unchanged).
#[allow(clippy::too_many_arguments)]
fn qk_case_f16(
    d: &Device,
    r: &mut Rng,
    label: &str,
    (n, heads, hd, ld): (usize, usize, usize, usize),
    offsets: [usize; 3],
    norm: [bool; 3],
    clamps: [Clamp; 3],
    rope: Option<(RopeLayout, usize)>,
) {
    let (qw, kw) = (r.vec(hd, 1.5), r.vec(hd, 1.5));
    let (qwd, kwd) = (d.upload(&qw).unwrap(), d.upload(&kw).unwrap());
    let inv = rope_inv_freq(hd, 100.0);
    let pos: Vec<i32> = match rope {
        Some((_, gw)) => (0..n)
            .flat_map(|t| [(t % gw) as i32, (t / gw) as i32])
            .collect(),
        None => vec![0; 2 * n],
    };
    let (posd, invd) = (d.upload(&pos).unwrap(), d.upload(&inv).unwrap());
    let spec = QkvSpec {
        tokens: n,
        heads,
        head_dim: hd,
        ld,
        offsets,
        q_weight: Some(&qwd),
        k_weight: Some(&kwd),
        norm,
        eps: 1e-6,
        clamps,
    };
    let rs = rope.map(|(layout, _)| RopeSpec {
        layout,
        pos: &posd,
        inv_freq: &invd,
    });
    let host_rope = rope.map(|(layout, _)| (layout, pos.as_slice(), inv.as_slice()));
    let x = round_h(&r.vec(n * ld, 2.0));
    let mut want = x.clone();
    host::qk_norm_rope(
        &mut want,
        n,
        heads,
        hd,
        ld,
        offsets,
        [Some(&qw), Some(&kw)],
        norm,
        1e-6,
        clamps,
        host_rope,
    );
    let mut qkv = d.upload(&to_h(&x)).unwrap();
    d.qk_norm_rope(&mut qkv, &spec, rs.as_ref()).unwrap();
    check(
        &format!("qk_norm_rope f16 {label} n{n} heads{heads} hd{hd} ld{ld} offsets{offsets:?}"),
        &from_h(&d.download(&qkv).unwrap()),
        &want,
        F16_OUT,
    );
}

/// qk_norm_rope in f16: the staged kernel at the towers' layouts (16 heads, each family's rope) and
/// with padded rows, the general kernel for an odd stride and a head dim that is not a multiple of 8.
#[test]
#[ignore = "needs a CUDA device"]
fn f16_qk_norm_rope_matches_host() {
    let d = dev();
    let mut r = Rng::new(23);
    let all = [true; 3];
    let none = [Clamp::NONE; 3];
    let cl = [Clamp::new(-1.5, 1.5), Clamp::NONE, Clamp::new(-1.0, 2.0)];
    let g4 = Some((RopeLayout::Gemma4, 57));
    let (w72, w64, w96) = (16 * 72, 16 * 64, 16 * 96);
    #[rustfmt::skip]
    let cases: [QkCaseF16<'_>; 8] = [
        ("gemma4 16 heads", (1001, 16, 72, 3 * w72), [0, w72, 2 * w72], all, cl, g4),
        ("glm 16 heads", (777, 16, 64, 3 * w64), [0, w64, 2 * w64], [true, true, false], none, Some((RopeLayout::Glm, 36))),
        ("step vendor 16 heads", (333, 16, 96, 3 * w96), [0, w96, 2 * w96], [false; 3], none, Some((RopeLayout::Step3p7Vendor, 52))),
        ("step hf 16 heads", (333, 16, 96, 3 * w96), [0, w96, 2 * w96], [false; 3], none, Some((RopeLayout::Step3p7Hf, 52))),
        ("padded", (23, 3, 72, 664), [8, 224, 448], all, cl, g4),
        ("no rope", (17, 5, 40, 600), [0, 200, 400], all, none, None),
        ("general: odd stride", (11, 2, 72, 435), [1, 146, 291], all, cl, g4),
        ("hd 36", (14, 3, 36, 324), [0, 108, 216], all, none, g4),
    ];
    for (label, dims, offsets, norm, clamps, rope) in cases {
        qk_case_f16(&d, &mut r, label, dims, offsets, norm, clamps, rope);
    }
}

/// block_gather_2x2 and im2col_3x3s2 move f16 values unchanged.
#[test]
#[ignore = "needs a CUDA device"]
fn f16_layout_gathers_match_host() {
    let d = dev();
    let mut r = Rng::new(24);
    let t = round_h(&r.vec(8 * 6 * 20, 1.0));
    let td = d.upload(&to_h(&t)).unwrap();
    for gw in [None, Some(6usize)] {
        let mut o = d.alloc::<f16>(48 * 20).unwrap();
        d.fill(&mut o, f16::NAN).unwrap();
        d.block_gather_2x2(&td, 48, 20, gw, &mut o).unwrap();
        let got = from_h(&d.download(&o).unwrap());
        assert!(got.iter().all(|v| v.is_finite()));
        assert_eq!(got, host::block_gather_2x2(&t, 48, 20, gw), "{gw:?}");
        println!("PARITY block_gather_2x2 f16 {gw:?}: exact");
    }
    for (gh, gw) in [(9usize, 9usize), (10, 7)] {
        let c = 12;
        let t = round_h(&r.vec(2 * gh * gw * c, 1.0));
        let (oh, ow) = (conv3x3s2_out(gh), conv3x3s2_out(gw));
        let mut o = d.alloc::<f16>(2 * oh * ow * 9 * c).unwrap();
        d.fill(&mut o, f16::NAN).unwrap();
        d.im2col_3x3s2(&d.upload(&to_h(&t)).unwrap(), 2, gh, gw, c, &mut o)
            .unwrap();
        let got = from_h(&d.download(&o).unwrap());
        assert!(got.iter().all(|v| v.is_finite()));
        assert_eq!(
            got,
            host::im2col_3x3s2(&t, 2, gh, gw, c),
            "im2col {gh}x{gw}"
        );
        println!("PARITY im2col f16 {gh}x{gw}: exact");
    }
}

/// cuBLASLt with f16 operands: f32 output with an f32 bias, f16 output with an f16 bias and the
/// GELU-tanh epilogue, and an accumulating f32 GEMM into a column block of a wider buffer.
#[test]
#[ignore = "needs a CUDA device"]
fn f16_gemm_matches_host() {
    let d = dev();
    let mut r = Rng::new(25);
    for &(m, n, k) in &[
        (77usize, 96usize, 64usize),
        (300, 200, 136),
        (1000, 1152, 72 * 16),
    ] {
        let x = round_h(&r.vec(m * k, 1.0));
        let w = round_h(&r.vec(n * k, 0.1));
        let b = r.vec(n, 0.5);
        let (xd, wd, bd) = (
            d.upload(&to_h(&x)).unwrap(),
            d.upload(&to_h(&w)).unwrap(),
            d.upload(&b).unwrap(),
        );
        let mut y = d.alloc::<f32>(m * n).unwrap();
        d.fill(&mut y, f32::NAN).unwrap();
        d.gemm(
            GemmInputs::F16 { x: &xd, w: &wd },
            Some(GemmBias::F32(&bd)),
            GemmOutput::F32(&mut y),
            GemmShape::dense(m, n, k),
            Epilogue::None,
        )
        .unwrap();
        check(
            &format!("gemm f16->f32 {m}x{n}x{k}"),
            &d.download(&y).unwrap(),
            &host::gemm(&x, &w, Some(&b), m, n, k),
            1e-5,
        );
        let bh = round_h(&b);
        let want_g: Vec<f32> = host::gemm(&x, &w, Some(&bh), m, n, k)
            .iter()
            .map(|v| host::activation(Activation::GeluTanh, *v))
            .collect();
        let bhd = d.upload(&to_h(&bh)).unwrap();
        let mut yh = d.alloc::<f16>(m * n).unwrap();
        d.fill(&mut yh, f16::NAN).unwrap();
        d.gemm(
            GemmInputs::F16 { x: &xd, w: &wd },
            Some(GemmBias::F16(&bhd)),
            GemmOutput::F16(&mut yh),
            GemmShape::dense(m, n, k),
            Epilogue::GeluTanh,
        )
        .unwrap();
        check(
            &format!("gemm f16->f16+gelu {m}x{n}x{k}"),
            &from_h(&d.download(&yh).unwrap()),
            &want_g,
            1e-3,
        );
        let ldy = n + 8;
        let init = r.vec(m * ldy, 1.0);
        let mut ya = d.upload(&init).unwrap();
        let shape = GemmShape {
            ldy,
            y_offset: 8,
            accumulate: true,
            ..GemmShape::dense(m, n, k)
        };
        d.gemm(
            GemmInputs::F16 { x: &xd, w: &wd },
            None,
            GemmOutput::F32(&mut ya),
            shape,
            Epilogue::None,
        )
        .unwrap();
        let got = d.download(&ya).unwrap();
        let want0 = host::gemm(&x, &w, None, m, n, k);
        let (mut g, mut wv) = (Vec::new(), Vec::new());
        for i in 0..m {
            for j in 0..n {
                g.push(got[i * ldy + 8 + j]);
                wv.push(want0[i * n + j] + init[i * ldy + 8 + j]);
            }
        }
        check(&format!("gemm f16 accumulate {m}x{n}x{k}"), &g, &wv, 1e-5);
        assert_eq!(got[0..8], init[0..8], "gemm wrote outside its column block");
    }
    // an f16 bias on the fused sm_90a kernel (bf16 only) is a shape error, never a launch
    let (xb, wb) = (
        d.alloc_zeros::<bf16>(64 * 64).unwrap(),
        d.alloc_zeros::<bf16>(64 * 64).unwrap(),
    );
    let bias = d.alloc_zeros::<f16>(64).unwrap();
    let mut yb = d.alloc::<bf16>(64 * 64).unwrap();
    let act = FusedAct::Plain {
        act: Activation::Silu,
        input: Clamp::NONE,
        output: Clamp::NONE,
    };
    let e = d.gemm_act(
        &xb,
        Mat::dense(64, 64),
        &wb,
        64,
        Some(GemmBias::F16(&bias)),
        &mut yb,
        Mat::dense(64, 64),
        act,
    );
    assert!(
        matches!(e, Err(GpuError::Shape { op: "gemm_act", .. })),
        "{e:?}"
    );
}

/// The stager uploads f16 weights over several staging buffers: f32 values rounded once, f16
/// bytes copied as they are.
#[test]
#[ignore = "needs a CUDA device"]
fn f16_stager_uploads_match_host() {
    let d = dev();
    let mut st = Stager::new(&d).unwrap();
    let mut r = Rng::new(28);
    // 3.5 staging buffers of f16
    let n = STAGING_BYTES / 2 * 7 / 2 + 13;
    let v = r.vec(n, 3.0);
    let h: DeviceBuffer<f16> = st.upload(&d, &v).unwrap();
    assert_eq!(d.download(&h).unwrap(), to_h(&v));
    let bytes: Vec<u8> = to_h(&v).iter().flat_map(|x| x.to_le_bytes()).collect();
    let src = LeBytes::new(&bytes, LeDtype::F16).unwrap();
    let g: DeviceBuffer<f16> = st.upload(&d, &src).unwrap();
    assert_eq!(d.download(&g).unwrap(), to_h(&v));
    println!("STAGER f16 uploaded {} bytes", st.uploaded_bytes());
}

/// One f16 attention case (the bf16 tests' shapes and scales) with `variant`: q, k, v columns of one
/// fused qkv buffer, output poisoned with NaN.
#[allow(clippy::too_many_arguments)]
fn attn_case_f16(
    d: &Device,
    r: &mut Rng,
    heads: usize,
    hd: usize,
    segs: &[usize],
    scale: f32,
    variant: Option<FlashVariant>,
    bound: f64,
) {
    let width = heads * hd;
    let ld = 3 * width;
    let tokens: usize = segs.iter().sum();
    let mut cu = vec![0i32];
    for s in segs {
        cu.push(cu.last().unwrap() + *s as i32);
    }
    let a = if scale == 1.0 { 0.35 } else { 1.5 };
    let qkv = round_h(&r.vec(tokens * ld, a));
    let want = host::attention(
        &qkv,
        &qkv,
        &qkv,
        ld,
        [0, width, 2 * width],
        heads,
        hd,
        &cu,
        scale,
    );
    let qd = d.upload(&to_h(&qkv)).unwrap();
    let cud = d.upload(&cu).unwrap();
    let mut o = d.alloc::<f16>(tokens * width).unwrap();
    d.fill(&mut o, f16::NAN).unwrap();
    let args = AttnArgs {
        q: (&qd, Mat::strided(tokens, width, ld, 0)),
        k: (&qd, Mat::strided(tokens, width, ld, width)),
        v: (&qd, Mat::strided(tokens, width, ld, 2 * width)),
        heads,
        head_dim: hd,
        cu_seqlens: &cud,
        cu_seqlens_host: &cu,
        scale,
        variant,
    };
    d.flash_attn(&args, &mut o, Mat::dense(tokens, width))
        .unwrap();
    check(
        &format!(
            "flash_attn f16 tier {} hd{hd} {variant:?} heads{heads} segs{segs:?} scale{scale}",
            d.tier().arch.cc_name()
        ),
        &from_h(&d.download(&o).unwrap()),
        &want,
        bound,
    );
}

/// The bf16 attention tests' cases (heads, head dim, segment lengths, softmax scale).
const ATTN_CASES: [(usize, usize, &[usize], f32); 6] = [
    (2, 64, &[1, 64, 200, 129], 0.125),
    (3, 72, &[77, 300, 5], 1.0),
    (2, 96, &[676, 31, 128], 0.102_062_07),
    (1, 72, &[1000], 1.0),
    (2, 96, &[3, 1300, 7], 0.102_062_07),
    (2, 64, &[193, 2, 385], 0.125),
];

/// Every f16 attention kernel this device's tier runs against the host: on 8.0 and newer the
/// m16n8k16 kernels (M1, M2) and Turing's (Sm75), on 7.5 Turing's alone with M1 / M2 refused; the
/// default variant once per case; and the refusals (warp-specialised f16, other head dims).
#[test]
#[ignore = "needs a CUDA device"]
fn f16_flash_attn_matches_host() {
    let d = dev();
    assert!(d.supports_f16(), "every tier runs f16");
    let mut r = Rng::new(26);
    let tier = d.tier().arch.kernels.f16_attention();
    let variants: &[FlashVariant] = match tier {
        F16Attention::M16n8k16 => &[FlashVariant::M1, FlashVariant::M2, FlashVariant::Sm75],
        F16Attention::Sm75 => &[FlashVariant::Sm75],
    };
    for &variant in variants {
        for &(heads, hd, segs, scale) in &ATTN_CASES {
            attn_case_f16(&d, &mut r, heads, hd, segs, scale, Some(variant), F16_ATTN);
        }
    }
    for &(heads, hd, segs, scale) in &ATTN_CASES {
        attn_case_f16(&d, &mut r, heads, hd, segs, scale, None, F16_ATTN);
    }
    attn_f16_refusals(&d);
}

/// The Turing tier forced on this card (`DeviceOptions::force_tier`, whatever `GPU_CORE_FORCE_TIER`
/// says): its compute_75 code through the driver's JIT, its 64 KB limit, and Turing's f16 attention
/// as the default; a test of the code path, not of a T4's speed.
#[test]
#[ignore = "needs a CUDA device"]
fn f16_flash_attn_on_the_turing_tier_matches_host() {
    let opts = DeviceOptions {
        force_tier: Some((7, 5)),
        ..DeviceOptions::default()
    };
    let d = Device::with_options(0, &opts).expect("a CUDA device of compute capability 7.5+");
    assert_eq!(
        d.tier().arch.kernels.f16_attention(),
        F16Attention::Sm75,
        "{}",
        d.tier()
    );
    let mut r = Rng::new(27);
    for &(heads, hd, segs, scale) in &ATTN_CASES {
        attn_case_f16(&d, &mut r, heads, hd, segs, scale, None, F16_ATTN);
    }
    attn_f16_refusals(&d);
}

/// f16 attention's refusals on this device's tier, as error values before any launch.
fn attn_f16_refusals(d: &Device) {
    let q = d.alloc::<f16>(64 * 80).unwrap();
    let cu = [0i32, 64];
    let cud = d.upload(&cu).unwrap();
    let mut o = d.alloc::<f16>(64 * 80).unwrap();
    let m = Mat::dense(64, 64);
    let args = |head_dim, variant| AttnArgs {
        q: (&q, m),
        k: (&q, m),
        v: (&q, m),
        heads: 1,
        head_dim,
        cu_seqlens: &cud,
        cu_seqlens_host: &cu,
        scale: 0.125,
        variant,
    };
    let mut refused = vec![
        (80, None),
        (64, Some(FlashVariant::Ws3)),
        (64, Some(FlashVariant::Ws2)),
    ];
    if d.tier().arch.kernels.f16_attention() == F16Attention::Sm75 {
        refused.extend([(64, Some(FlashVariant::M1)), (64, Some(FlashVariant::M2))]);
    }
    for (hd, v) in refused {
        let e = d.flash_attn(&args(hd, v), &mut o, Mat::dense(64, 80));
        assert!(
            matches!(
                e,
                Err(GpuError::Shape {
                    op: "flash_attn",
                    ..
                })
            ),
            "f16 hd {hd} {v:?}: {e:?}"
        );
    }
}
