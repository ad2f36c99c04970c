//! Device-vs-host parity tests of the attention side: per-head q/k norms with the families'
//! ropes (tower layouts and the launch shapes beyond them) and flash attention (bf16 variants,
//! f32). Each needs a CUDA device: `cargo xtask gpu-test` runs them.
use crate::gpu_tests::{check, dev, from_bf, round_bf, to_bf, Rng};
use crate::host;
use crate::*;

/// Grid positions (x, y) of a gw×gh image in raster or glm's 2×2 block-major order.
fn positions(gh: usize, gw: usize, block_major: bool) -> Vec<i32> {
    let mut p = Vec::new();
    if block_major {
        for by in 0..gh / 2 {
            for bx in 0..gw / 2 {
                for iy in 0..2 {
                    for ix in 0..2 {
                        p.extend([(2 * bx + ix) as i32, (2 * by + iy) as i32]);
                    }
                }
            }
        }
    } else {
        for y in 0..gh {
            for x in 0..gw {
                p.extend([x as i32, y as i32]);
            }
        }
    }
    p
}

#[test]
#[ignore = "needs a CUDA device"]
fn qk_norm_rope_matches_host() {
    let d = dev();
    let mut r = Rng::new(4);
    // (layout, heads, hd, theta, norms, grid h, grid w)
    let cases = [
        (
            RopeLayout::Gemma4,
            4usize,
            72usize,
            100.0,
            [true, true, true],
            6usize,
            9usize,
        ),
        (RopeLayout::Glm, 3, 64, 10000.0, [true, true, false], 8, 12),
        (
            RopeLayout::Step3p7Hf,
            2,
            96,
            10000.0,
            [false, false, false],
            13,
            7,
        ),
        (
            RopeLayout::Step3p7Vendor,
            2,
            96,
            10000.0,
            [false, false, false],
            52,
            52,
        ),
    ];
    for (layout, heads, hd, theta, norm, gh, gw) in cases {
        let n = gh * gw;
        let width = heads * hd;
        let ld = 3 * width;
        let x = round_bf(&r.vec(n * ld, 2.0));
        let pos = positions(gh, gw, layout == RopeLayout::Glm);
        let inv = rope_inv_freq(hd, theta);
        let (qw, kw) = (r.vec(hd, 1.5), r.vec(hd, 1.5));
        let mut want = x.clone();
        let clamps = if layout == RopeLayout::Gemma4 {
            [Clamp::new(-1.5, 1.5), Clamp::NONE, Clamp::new(-1.0, 2.0)]
        } else {
            [Clamp::NONE; 3]
        };
        host::qk_norm_rope(
            &mut want,
            n,
            heads,
            hd,
            ld,
            [0, width, 2 * width],
            [Some(&qw), Some(&kw)],
            norm,
            1e-6,
            clamps,
            Some((layout, &pos, &inv)),
        );
        let mut qkv = d.upload(&to_bf(&x)).unwrap();
        let (posd, invd, qwd, kwd) = (
            d.upload(&pos).unwrap(),
            d.upload(&inv).unwrap(),
            d.upload(&qw).unwrap(),
            d.upload(&kw).unwrap(),
        );
        let spec = QkvSpec {
            tokens: n,
            heads,
            head_dim: hd,
            ld,
            offsets: [0, width, 2 * width],
            q_weight: Some(&qwd),
            k_weight: Some(&kwd),
            norm,
            eps: 1e-6,
            clamps,
        };
        d.qk_norm_rope(
            &mut qkv,
            &spec,
            Some(&RopeSpec {
                layout,
                pos: &posd,
                inv_freq: &invd,
            }),
        )
        .unwrap();
        check(
            &format!("qk_norm_rope {layout:?} hd{hd} n{n}"),
            &from_bf(&d.download(&qkv).unwrap()),
            &want,
            4e-3,
        );
        // f32: fresh unrounded inputs, same spec
        let xf = r.vec(n * ld, 2.0);
        let mut want = xf.clone();
        host::qk_norm_rope(
            &mut want,
            n,
            heads,
            hd,
            ld,
            [0, width, 2 * width],
            [Some(&qw), Some(&kw)],
            norm,
            1e-6,
            clamps,
            Some((layout, &pos, &inv)),
        );
        let mut qkvf = d.upload(&xf).unwrap();
        d.qk_norm_rope(
            &mut qkvf,
            &spec,
            Some(&RopeSpec {
                layout,
                pos: &posd,
                inv_freq: &invd,
            }),
        )
        .unwrap();
        check(
            &format!("qk_norm_rope f32 {layout:?} hd{hd} n{n}"),
            &d.download(&qkvf).unwrap(),
            &want,
            1e-5,
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn attn_case(
    d: &Device,
    r: &mut Rng,
    heads: usize,
    hd: usize,
    segs: &[usize],
    scale: f32,
    variant: FlashVariant,
    bound: f64,
) {
    let width = heads * hd;
    let ld = 3 * width;
    let tokens: usize = segs.iter().sum();
    let mut cu = vec![0i32];
    for s in segs {
        cu.push(cu.last().unwrap() + *s as i32);
    }
    // q/k scaled so that softmax is neither flat nor one-hot
    let a = if scale == 1.0 { 0.35 } else { 1.5 };
    let qkv = round_bf(&r.vec(tokens * ld, a));
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
    let qd = d.upload(&to_bf(&qkv)).unwrap();
    let cud = d.upload(&cu).unwrap();
    let mut o = d.alloc::<bf16>(tokens * width).unwrap();
    d.fill(&mut o, bf16::NAN).unwrap();
    let args = AttnArgs {
        q: (&qd, Mat::strided(tokens, width, ld, 0)),
        k: (&qd, Mat::strided(tokens, width, ld, width)),
        v: (&qd, Mat::strided(tokens, width, ld, 2 * width)),
        heads,
        head_dim: hd,
        cu_seqlens: &cud,
        cu_seqlens_host: &cu,
        scale,
        variant: Some(variant),
    };
    d.flash_attn(&args, &mut o, Mat::dense(tokens, width))
        .unwrap();
    check(
        &format!("flash_attn hd{hd} {variant:?} heads{heads} segs{segs:?} scale{scale}"),
        &from_bf(&d.download(&o).unwrap()),
        &want,
        bound,
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn flash_attn_matches_host() {
    let d = dev();
    let mut r = Rng::new(5);
    if !d.supports_bf16() {
        // Turing's tier: no bf16 tensor cores, so bf16 attention is refused, never launched
        let e = attn_refused_without_bf16(&d);
        eprintln!(
            "flash_attn_matches_host: tier {} refuses bf16 attention: {e}",
            d.tier()
        );
        return;
    }
    let mut variants = vec![FlashVariant::M1, FlashVariant::M2];
    // the warp-specialised kernels must be there on Hopper's tier; elsewhere (Ampere, Ada, Blackwell,
    // or a tier forced on an H100) only the mma.sync ones exist
    let hopper = d.tier().arch.kernels == crate::tier::KernelSet::Hopper;
    assert_eq!(d.has_kernel(Kernel::FlashAttnWsHd72C3Bf16), hopper);
    if hopper {
        variants.extend([FlashVariant::Ws2, FlashVariant::Ws3]);
    } else {
        eprintln!(
            "flash_attn_matches_host: no sm_90a device, warp-specialised variants not tested"
        );
    }
    // heads, head dim, segment lengths, softmax scale
    let cases: [(usize, usize, &[usize], f32); 6] = [
        (2, 64, &[1, 64, 200, 129], 0.125),
        (3, 72, &[77, 300, 5], 1.0),
        (2, 96, &[2704 / 4, 31, 128], 96f32.powf(-0.5)),
        (1, 72, &[1000], 1.0),
        // blocks whose later query boxes lie wholly past the last token (the copy engine fills zeros)
        (2, 96, &[3, 1300, 7], 96f32.powf(-0.5)),
        (2, 64, &[193, 2, 385], 0.125),
    ];
    for variant in variants {
        for &(heads, hd, segs, scale) in &cases {
            attn_case(&d, &mut r, heads, hd, segs, scale, variant, 1e-2);
        }
    }
}

/// On a tier without bf16 tensor cores, a bf16 attention call is an error naming the tier.
fn attn_refused_without_bf16(d: &Device) -> GpuError {
    let q = d.alloc::<bf16>(64 * 64).unwrap();
    let cu = [0i32, 64];
    let cud = d.upload(&cu).unwrap();
    let mut o = d.alloc::<bf16>(64 * 64).unwrap();
    let args = AttnArgs {
        q: (&q, Mat::dense(64, 64)),
        k: (&q, Mat::dense(64, 64)),
        v: (&q, Mat::dense(64, 64)),
        heads: 1,
        head_dim: 64,
        cu_seqlens: &cud,
        cu_seqlens_host: &cu,
        scale: 0.125,
        variant: None,
    };
    let e = d
        .flash_attn(&args, &mut o, Mat::dense(64, 64))
        .expect_err("bf16 attention on a tier without bf16 tensor cores");
    assert!(e.to_string().contains("bf16 tensor cores"), "{e}");
    e
}

/// f32 exact attention on a qkv buffer with an odd row pitch and odd column offsets, strided output.
fn attn_case_f32(d: &Device, r: &mut Rng, heads: usize, hd: usize, segs: &[usize], scale: f32) {
    let width = heads * hd;
    let ld = 3 * width + 5;
    let offs = [1, width + 2, 2 * width + 5];
    let tokens: usize = segs.iter().sum();
    let mut cu = vec![0i32];
    for s in segs {
        cu.push(cu.last().unwrap() + *s as i32);
    }
    let a = if scale == 1.0 { 0.35 } else { 1.5 };
    let qkv = r.vec(tokens * ld, a);
    let want = host::attention(&qkv, &qkv, &qkv, ld, offs, heads, hd, &cu, scale);
    let qd = d.upload(&qkv).unwrap();
    let cud = d.upload(&cu).unwrap();
    let old = width + 3;
    let mut o = d.alloc::<f32>(tokens * old).unwrap();
    d.fill(&mut o, f32::NAN).unwrap();
    let args = AttnArgs {
        q: (&qd, Mat::strided(tokens, width, ld, offs[0])),
        k: (&qd, Mat::strided(tokens, width, ld, offs[1])),
        v: (&qd, Mat::strided(tokens, width, ld, offs[2])),
        heads,
        head_dim: hd,
        cu_seqlens: &cud,
        cu_seqlens_host: &cu,
        scale,
        variant: None,
    };
    d.flash_attn(&args, &mut o, Mat::strided(tokens, width, old, 3))
        .unwrap();
    let got = d.download(&o).unwrap();
    let got: Vec<f32> = (0..tokens)
        .flat_map(|i| got[i * old + 3..i * old + 3 + width].to_vec())
        .collect();
    check(
        &format!("flash_attn f32 hd{hd} heads{heads} segs{segs:?} scale{scale}"),
        &got,
        &want,
        1e-5,
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn flash_attn_f32_matches_host() {
    let d = dev();
    let mut r = Rng::new(7);
    // heads, head dim, segment lengths (an empty one included), softmax scale
    let cases: [(usize, usize, &[usize], f32); 6] = [
        (2, 64, &[1, 64, 200, 129], 0.125),
        (3, 72, &[77, 0, 300, 5], 1.0),
        (2, 96, &[2704 / 4, 31, 33], 96f32.powf(-0.5)),
        (1, 72, &[1000], 1.0),
        (2, 128, &[95, 257], 128f32.powf(-0.5)),
        (3, 40, &[3, 50], 0.2),
    ];
    for (heads, hd, segs, scale) in cases {
        attn_case_f32(&d, &mut r, heads, hd, segs, scale);
    }
    // shape errors are values: bf16 head dims, f32 variant, f32 head dim over the limit
    let q = d.alloc::<f32>(4 * 129).unwrap();
    let cu = d.upload(&[0i32, 4]).unwrap();
    let mut o = d.alloc::<f32>(4 * 129).unwrap();
    let m = Mat::dense(4, 129);
    let bad = AttnArgs {
        q: (&q, m),
        k: (&q, m),
        v: (&q, m),
        heads: 1,
        head_dim: 129,
        cu_seqlens: &cu,
        cu_seqlens_host: &[0, 4],
        scale: 1.0,
        variant: None,
    };
    let e = d.flash_attn(&bad, &mut o, m);
    assert!(
        matches!(
            e,
            Err(GpuError::Shape {
                op: "flash_attn",
                ..
            })
        ),
        "{e:?}"
    );
    let bad = AttnArgs {
        head_dim: 64,
        variant: Some(FlashVariant::M1),
        ..bad
    };
    let e = d.flash_attn(&bad, &mut o, m);
    assert!(
        matches!(
            e,
            Err(GpuError::Shape {
                op: "flash_attn",
                ..
            })
        ),
        "{e:?}"
    );
}

/// One row of [`qk_norm_rope_layouts_match_host`]'s table: the arguments of [`qk_case`] after the
/// device and the generator.
type QkCase<'a> = (
    &'a str,
    (usize, usize, usize, usize),
    [usize; 3],
    [bool; 3],
    [Clamp; 3],
    Option<(RopeLayout, usize)>,
    bool,
);

/// One qk_norm_rope case on both dtypes: the whole qkv buffer against the host twin (parts without
/// work must come back unchanged).
#[allow(clippy::too_many_arguments)]
fn qk_case(
    d: &Device,
    r: &mut Rng,
    label: &str,
    (n, heads, hd, ld): (usize, usize, usize, usize),
    offsets: [usize; 3],
    norm: [bool; 3],
    clamps: [Clamp; 3],
    rope: Option<(RopeLayout, usize)>,
    weighted: bool,
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
        q_weight: weighted.then_some(&qwd),
        k_weight: weighted.then_some(&kwd),
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
    let weights = if weighted {
        [Some(qw.as_slice()), Some(kw.as_slice())]
    } else {
        [None, None]
    };
    let tag = format!("{label} n{n} heads{heads} hd{hd} ld{ld} offsets{offsets:?}");
    // bf16
    let x = round_bf(&r.vec(n * ld, 2.0));
    let mut want = x.clone();
    host::qk_norm_rope(
        &mut want, n, heads, hd, ld, offsets, weights, norm, 1e-6, clamps, host_rope,
    );
    let mut qkv = d.upload(&to_bf(&x)).unwrap();
    d.qk_norm_rope(&mut qkv, &spec, rs.as_ref()).unwrap();
    check(
        &format!("qk_norm_rope bf16 {tag}"),
        &from_bf(&d.download(&qkv).unwrap()),
        &want,
        4e-3,
    );
    // f32
    let x = r.vec(n * ld, 2.0);
    let mut want = x.clone();
    host::qk_norm_rope(
        &mut want, n, heads, hd, ld, offsets, weights, norm, 1e-6, clamps, host_rope,
    );
    let mut qkv = d.upload(&x).unwrap();
    d.qk_norm_rope(&mut qkv, &spec, rs.as_ref()).unwrap();
    check(
        &format!("qk_norm_rope f32 {tag}"),
        &d.download(&qkv).unwrap(),
        &want,
        1e-5,
    );
}

/// qk_norm_rope beyond the tower layouts of `qk_norm_rope_matches_host`: the staged kernel with the
/// towers' 16 heads and many tokens (a ragged last block), padded rows and shifted offsets, norms
/// without rope, rope without some norms, a part with only a clamp, head dims 8 and 256, gemma's
/// per-head calls (heads 1, offsets i·kd), and the general kernel for strides / offsets that are not
/// multiples of 16 bytes and bf16 head dims that are not multiples of 8.
#[test]
#[ignore = "needs a CUDA device"]
fn qk_norm_rope_layouts_match_host() {
    let d = dev();
    let mut r = Rng::new(13);
    let all = [true; 3];
    let none = [Clamp::NONE; 3];
    let cl = [Clamp::new(-1.5, 1.5), Clamp::NONE, Clamp::new(-1.0, 2.0)];
    let g4 = Some((RopeLayout::Gemma4, 57));
    let (w72, w64, w96) = (16 * 72, 16 * 64, 16 * 96);
    // label, (tokens, heads, head_dim, row stride), part offsets, normed parts, clamps, rope, weighted
    #[rustfmt::skip]
    let cases: [QkCase<'_>; 15] = [
        ("gemma4 16 heads", (1001, 16, 72, 3 * w72), [0, w72, 2 * w72], all, cl, g4, true),
        ("glm 16 heads", (777, 16, 64, 3 * w64), [0, w64, 2 * w64], [true, true, false], none, Some((RopeLayout::Glm, 36)), true),
        ("step vendor 16 heads", (333, 16, 96, 3 * w96), [0, w96, 2 * w96], [false; 3], none, Some((RopeLayout::Step3p7Vendor, 52)), true),
        ("step hf 16 heads", (333, 16, 96, 3 * w96), [0, w96, 2 * w96], [false; 3], none, Some((RopeLayout::Step3p7Hf, 52)), true),
        ("padded", (23, 3, 72, 664), [8, 224, 448], all, cl, g4, true),
        ("no rope", (17, 5, 40, 600), [0, 200, 400], all, none, None, true),
        ("weightless", (17, 5, 40, 600), [0, 200, 400], all, none, g4, false),
        ("k norm only, v clamp only", (19, 3, 64, 576), [0, 192, 384], [false, true, false], cl, Some((RopeLayout::Step3p7Hf, 5)), true),
        ("general: odd stride", (11, 2, 72, 435), [1, 146, 291], all, cl, g4, true),
        ("hd 36", (14, 3, 36, 324), [0, 108, 216], all, none, g4, true),
        ("per head kd 80", (29, 1, 72, 480), [80, 240, 400], all, none, g4, true),
        ("per head kd 76", (29, 1, 72, 456), [76, 228, 380], all, none, g4, true),
        ("hd 256", (301, 2, 256, 1536), [0, 512, 1024], all, none, Some((RopeLayout::Glm, 17)), true),
        ("hd 8", (40, 5, 8, 120), [0, 40, 80], all, none, Some((RopeLayout::Step3p7Vendor, 7)), true),
        ("nothing to do", (5, 2, 64, 384), [0, 128, 256], [false; 3], none, None, true),
    ];
    for (label, dims, offsets, norm, clamps, rope, weighted) in cases {
        qk_case(
            &d, &mut r, label, dims, offsets, norm, clamps, rope, weighted,
        );
    }
}
