//! Device-vs-host parity tests. Each needs a CUDA device: `cargo xtask gpu-test` runs them.
//! Inputs are fresh random values (never zeros); outputs are poisoned with NaN before each launch.
use crate::host;
use crate::*;

/// Small deterministic generator (xorshift64*), values in [−a, a).
pub(crate) struct Rng(u64);
impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(crate) fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        v as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    pub(crate) fn vec(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * a).collect()
    }
}

fn dev() -> Device {
    Device::new(0).expect("a CUDA device")
}
fn to_bf(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|x| bf16::from_f32(*x)).collect()
}
fn from_bf(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}
/// bf16-rounded copy (the values the device actually sees).
fn round_bf(v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| bf16::from_f32(*x).to_f32()).collect()
}
fn check(name: &str, got: &[f32], want: &[f32], bound: f64) {
    assert!(
        got.iter().all(|v| v.is_finite()),
        "{name}: non-finite output (unwritten or NaN)"
    );
    let e = host::rel_l2(got, want);
    println!("PARITY {name}: rel_l2 = {e:.3e} (bound {bound:.0e})");
    assert!(e <= bound, "{name}: rel_l2 {e:.3e} > {bound:.0e}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn gemm_matches_host() {
    let d = dev();
    let mut r = Rng::new(1);
    for &(m, n, k) in &[
        (77usize, 96usize, 64usize),
        (300, 200, 136),
        (1000, 1152, 72 * 16),
    ] {
        let x = round_bf(&r.vec(m * k, 1.0));
        let w = round_bf(&r.vec(n * k, 0.1));
        let b = r.vec(n, 0.5);
        let want = host::gemm(&x, &w, Some(&b), m, n, k);
        let (xd, wd, bd) = (
            d.upload(&to_bf(&x)).unwrap(),
            d.upload(&to_bf(&w)).unwrap(),
            d.upload(&b).unwrap(),
        );
        // bf16 in, f32 out, f32 bias
        let mut y = d.alloc::<f32>(m * n).unwrap();
        d.fill(&mut y, f32::NAN).unwrap();
        d.gemm(
            GemmInputs::Bf16 { x: &xd, w: &wd },
            Some(GemmBias::F32(&bd)),
            GemmOutput::F32(&mut y),
            GemmShape::dense(m, n, k),
            Epilogue::None,
        )
        .unwrap();
        check(
            &format!("gemm bf16->f32 {m}x{n}x{k}"),
            &d.download(&y).unwrap(),
            &want,
            1e-5,
        );
        // bf16 out, bf16 bias, GELU-tanh epilogue
        let bb = round_bf(&b);
        let want_g: Vec<f32> = host::gemm(&x, &w, Some(&bb), m, n, k)
            .iter()
            .map(|v| host::activation(Activation::GeluTanh, *v))
            .collect();
        let bbd = d.upload(&to_bf(&bb)).unwrap();
        let mut yb = d.alloc::<bf16>(m * n).unwrap();
        d.fill(&mut yb, bf16::NAN).unwrap();
        d.gemm(
            GemmInputs::Bf16 { x: &xd, w: &wd },
            Some(GemmBias::Bf16(&bbd)),
            GemmOutput::Bf16(&mut yb),
            GemmShape::dense(m, n, k),
            Epilogue::GeluTanh,
        )
        .unwrap();
        check(
            &format!("gemm bf16->bf16+gelu {m}x{n}x{k}"),
            &from_bf(&d.download(&yb).unwrap()),
            &want_g,
            8e-3,
        );
        // f32 exact mode, strided output into a wider buffer, accumulate
        let (xf, wf) = (d.upload(&x).unwrap(), d.upload(&w).unwrap());
        let ldy = n + 8;
        let init = r.vec(m * ldy, 1.0);
        let mut yf = d.upload(&init).unwrap();
        let shape = GemmShape {
            ldy,
            y_offset: 8,
            accumulate: true,
            ..GemmShape::dense(m, n, k)
        };
        d.gemm(
            GemmInputs::F32 { x: &xf, w: &wf },
            None,
            GemmOutput::F32(&mut yf),
            shape,
            Epilogue::None,
        )
        .unwrap();
        let got = d.download(&yf).unwrap();
        let want0 = host::gemm(&x, &w, None, m, n, k);
        let mut g = Vec::new();
        let mut wv = Vec::new();
        for i in 0..m {
            for j in 0..n {
                g.push(got[i * ldy + 8 + j]);
                wv.push(want0[i * n + j] + init[i * ldy + 8 + j]);
            }
        }
        check(&format!("gemm f32 accumulate {m}x{n}x{k}"), &g, &wv, 1e-5);
        assert_eq!(got[0..8], init[0..8], "gemm wrote outside its column block");
    }
}

/// Tuning times every candidate on the call's own buffers: an accumulating GEMM must still add
/// onto the untouched y exactly once, in both modes, and tuning reports what it measured.
#[test]
#[ignore = "needs a CUDA device"]
fn gemm_tuning_keeps_accumulate_exact() {
    let d = dev();
    let mut r = Rng::new(11);
    let (m, n, k) = (640usize, 768usize, 512usize);
    let x = round_bf(&r.vec(m * k, 1.0));
    let w = round_bf(&r.vec(n * k, 0.1));
    let b = r.vec(n, 0.5);
    let init = r.vec(m * n, 1.0);
    let mut want = host::gemm(&x, &w, Some(&b), m, n, k);
    for (v, i) in want.iter_mut().zip(&init) {
        *v += i;
    }
    let (xd, wd, bd) = (
        d.upload(&to_bf(&x)).unwrap(),
        d.upload(&to_bf(&w)).unwrap(),
        d.upload(&b).unwrap(),
    );
    for tuning in [GemmTuning::Measured, GemmTuning::Heuristic] {
        d.set_gemm_tuning(tuning);
        assert_eq!(d.gemm_tuning(), tuning);
        let mut y = d.upload(&init).unwrap();
        d.gemm(
            GemmInputs::Bf16 { x: &xd, w: &wd },
            Some(GemmBias::F32(&bd)),
            GemmOutput::F32(&mut y),
            GemmShape {
                accumulate: true,
                ..GemmShape::dense(m, n, k)
            },
            Epilogue::None,
        )
        .unwrap();
        check(
            &format!("gemm bf16 accumulate, first call under {tuning:?}"),
            &d.download(&y).unwrap(),
            &want,
            1e-5,
        );
        let tuned = d.gemm_tuned();
        match tuning {
            GemmTuning::Measured => {
                let t = tuned.first().expect("a tuned shape");
                println!("GEMM-TUNED {t:?}");
                assert!(t.candidates >= 1 && t.chosen < GEMM_CANDIDATES);
                assert!(t.heuristic_ms > 0.0 && t.best_ms <= t.heuristic_ms);
                assert!(t.chosen_ms <= t.heuristic_ms && t.shape.accumulate);
            }
            GemmTuning::Heuristic => assert!(tuned.is_empty(), "{tuned:?}"),
        }
    }
    d.set_gemm_tuning(GemmTuning::default());
}

#[test]
#[ignore = "needs a CUDA device"]
fn gemm_rejects_bad_shapes() {
    let d = dev();
    let x = d.alloc::<bf16>(10).unwrap();
    let w = d.alloc::<bf16>(10).unwrap();
    let mut y = d.alloc::<f32>(10).unwrap();
    let e = d.gemm(
        GemmInputs::Bf16 { x: &x, w: &w },
        None,
        GemmOutput::F32(&mut y),
        GemmShape::dense(4, 4, 4),
        Epilogue::None,
    );
    assert!(
        matches!(e, Err(GpuError::Shape { op: "gemm", .. })),
        "{e:?}"
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn oversized_alloc_is_out_of_memory() {
    let d = dev();
    let e = d.alloc::<f32>(1usize << 40); // 4 TiB
    assert!(matches!(e, Err(GpuError::OutOfMemory { .. })), "{e:?}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn norms_match_host() {
    let d = dev();
    let mut r = Rng::new(2);
    for &(rows, h) in &[(1usize, 72usize), (37, 1152), (513, 1536), (64, 4096)] {
        let x: Vec<f32> = r.vec(rows * h, 3.0).iter().map(|v| v + 0.7).collect();
        let w = r.vec(h, 1.5);
        let b = r.vec(h, 0.5);
        let xd = d.upload(&x).unwrap();
        let (wd, bd) = (d.upload(&w).unwrap(), d.upload(&b).unwrap());
        let m = Mat::dense(rows, h);
        let mut yf = d.alloc::<f32>(rows * h).unwrap();
        d.fill(&mut yf, f32::NAN).unwrap();
        d.rms_norm(&xd, m, Some(&wd), &mut yf, m, 1e-6, Clamp::NONE)
            .unwrap();
        check(
            &format!("rms_norm f32 {rows}x{h}"),
            &d.download(&yf).unwrap(),
            &host::rms_norm(&x, h, Some(&w), 1e-6, Clamp::NONE),
            1e-6,
        );
        let mut yb = d.alloc::<bf16>(rows * h).unwrap();
        d.fill(&mut yb, bf16::NAN).unwrap();
        d.rms_norm(&xd, m, None, &mut yb, m, 1e-5, Clamp::new(-1.0, 1.5))
            .unwrap();
        check(
            &format!("rms_norm weightless clamp bf16 {rows}x{h}"),
            &from_bf(&d.download(&yb).unwrap()),
            &host::rms_norm(&x, h, None, 1e-5, Clamp::new(-1.0, 1.5)),
            4e-3,
        );
        d.fill(&mut yf, f32::NAN).unwrap();
        d.layer_norm(&xd, m, Some(&wd), Some(&bd), &mut yf, m, 1e-5)
            .unwrap();
        check(
            &format!("layer_norm f32 {rows}x{h}"),
            &d.download(&yf).unwrap(),
            &host::layer_norm(&x, h, Some(&w), Some(&b), 1e-5),
            1e-6,
        );
        d.fill(&mut yb, bf16::NAN).unwrap();
        d.layer_norm(&xd, m, Some(&wd), Some(&bd), &mut yb, m, 1e-5)
            .unwrap();
        check(
            &format!("layer_norm bf16 {rows}x{h}"),
            &from_bf(&d.download(&yb).unwrap()),
            &host::layer_norm(&x, h, Some(&w), Some(&b), 1e-5),
            4e-3,
        );
        // residual with LayerScale (strided y)
        let ld = h + 4;
        let y = r.vec(rows * ld, 2.0);
        let s = r.vec(h, 0.2);
        let (ydv, sd) = (d.upload(&y).unwrap(), d.upload(&s).unwrap());
        let mut xr = d.upload(&x).unwrap();
        d.residual_add(
            &mut xr,
            &ydv,
            Mat::strided(rows, h, ld, 4),
            Some(&sd),
            Clamp::NONE,
        )
        .unwrap();
        let yc: Vec<f32> = (0..rows)
            .flat_map(|i| y[i * ld + 4..i * ld + 4 + h].to_vec())
            .collect();
        let mut want = x.clone();
        host::residual_add(&mut want, &yc, h, Some(&s), Clamp::NONE);
        check(
            &format!("residual_add layerscale {rows}x{h}"),
            &d.download(&xr).unwrap(),
            &want,
            1e-7,
        );
        // gemma sandwich + next pre-norm
        let mut xr = d.upload(&x).unwrap();
        let mut nxt = d.alloc::<bf16>(rows * h).unwrap();
        d.fill(&mut nxt, bf16::NAN).unwrap();
        let yd2 = d.upload(&yc).unwrap();
        d.residual_rms_add(
            &mut xr,
            &yd2,
            Mat::dense(rows, h),
            Some(&wd),
            1e-6,
            Clamp::new(-1.5, 1.5),
            Some((Some(&bd), &mut nxt, 1e-6)),
        )
        .unwrap();
        let mut want = x.clone();
        let wn = host::residual_rms_add(
            &mut want,
            &yc,
            h,
            Some(&w),
            1e-6,
            Clamp::new(-1.5, 1.5),
            Some((Some(&b), 1e-6)),
        )
        .unwrap();
        check(
            &format!("residual_rms_add x {rows}x{h}"),
            &d.download(&xr).unwrap(),
            &want,
            1e-6,
        );
        check(
            &format!("residual_rms_add next {rows}x{h}"),
            &from_bf(&d.download(&nxt).unwrap()),
            &wn,
            4e-3,
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn activations_match_host() {
    let d = dev();
    let mut r = Rng::new(3);
    let (rows, cols) = (333usize, 4304usize);
    let gu = round_bf(&r.vec(rows * 2 * cols, 6.0));
    let gud = d.upload(&to_bf(&gu)).unwrap();
    let gate: Vec<f32> = (0..rows)
        .flat_map(|i| gu[i * 2 * cols..i * 2 * cols + cols].to_vec())
        .collect();
    let up: Vec<f32> = (0..rows)
        .flat_map(|i| gu[i * 2 * cols + cols..(i + 1) * 2 * cols].to_vec())
        .collect();
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
    for g in gates {
        let mut out = d.alloc::<bf16>(rows * cols).unwrap();
        d.fill(&mut out, bf16::NAN).unwrap();
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
            &format!("gated_act {g:?}"),
            &from_bf(&d.download(&out).unwrap()),
            &host::gated_act(&gate, &up, g),
            4e-3,
        );
    }
    for a in [
        Activation::QuickGelu,
        Activation::GeluErf,
        Activation::GeluTanh,
        Activation::Silu,
        Activation::Identity,
    ] {
        let mut x = d.upload(&to_bf(&gate)).unwrap();
        d.act_in_place(
            &mut x,
            Mat::dense(rows, cols),
            a,
            Clamp::new(-4.0, 5.0),
            Clamp::new(-3.0, 3.0),
        )
        .unwrap();
        check(
            &format!("act {a:?}"),
            &from_bf(&d.download(&x).unwrap()),
            &host::act(&gate, a, Clamp::new(-4.0, 5.0), Clamp::new(-3.0, 3.0)),
            4e-3,
        );
    }
    // f32: the same gates and activations on unrounded f32 inputs, strided out
    let guf = r.vec(rows * 2 * cols, 6.0);
    let gufd = d.upload(&guf).unwrap();
    let gate_f: Vec<f32> = (0..rows)
        .flat_map(|i| guf[i * 2 * cols..i * 2 * cols + cols].to_vec())
        .collect();
    let up_f: Vec<f32> = (0..rows)
        .flat_map(|i| guf[i * 2 * cols + cols..(i + 1) * 2 * cols].to_vec())
        .collect();
    let ldo = cols + 3;
    for g in gates {
        let mut out = d.alloc::<f32>(rows * ldo).unwrap();
        d.fill(&mut out, f32::NAN).unwrap();
        d.gated_act(
            &mut out,
            Mat::strided(rows, cols, ldo, 3),
            &gufd,
            Mat::strided(rows, cols, 2 * cols, 0),
            &gufd,
            Mat::strided(rows, cols, 2 * cols, cols),
            g,
        )
        .unwrap();
        let got = d.download(&out).unwrap();
        let got: Vec<f32> = (0..rows)
            .flat_map(|i| got[i * ldo + 3..i * ldo + 3 + cols].to_vec())
            .collect();
        check(
            &format!("gated_act f32 {g:?}"),
            &got,
            &host::gated_act(&gate_f, &up_f, g),
            1e-5,
        );
    }
    for a in [
        Activation::QuickGelu,
        Activation::GeluErf,
        Activation::GeluTanh,
        Activation::Silu,
        Activation::Identity,
    ] {
        let mut x = d.upload(&gate_f).unwrap();
        d.act_in_place(
            &mut x,
            Mat::dense(rows, cols),
            a,
            Clamp::new(-4.0, 5.0),
            Clamp::new(-3.0, 3.0),
        )
        .unwrap();
        check(
            &format!("act f32 {a:?}"),
            &d.download(&x).unwrap(),
            &host::act(&gate_f, a, Clamp::new(-4.0, 5.0), Clamp::new(-3.0, 3.0)),
            1e-5,
        );
    }
    let xf = r.vec(1001, 3.0);
    let xd = d.upload(&xf).unwrap();
    let mut ob = d.alloc::<bf16>(1001).unwrap();
    d.fill(&mut ob, bf16::NAN).unwrap();
    d.cast_f32_bf16(&xd, &mut ob).unwrap();
    check(
        "cast_f32_bf16",
        &from_bf(&d.download(&ob).unwrap()),
        &xf,
        4e-3,
    );
}

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
    let mut variants = vec![FlashVariant::M1, FlashVariant::M2];
    // the warp-specialised kernels must be there on a Hopper device; elsewhere only the mma.sync ones exist
    let hopper = d.compute_capability().unwrap() == (9, 0);
    assert_eq!(d.has_kernel(Kernel::FlashAttnWsHd72C3Bf16), hopper);
    if hopper {
        variants.extend([FlashVariant::Ws2, FlashVariant::Ws3]);
    } else {
        eprintln!(
            "flash_attn_matches_host: no sm_90a device, warp-specialised variants not tested"
        );
    }
    for variant in variants {
        attn_case(&d, &mut r, 2, 64, &[1, 64, 200, 129], 0.125, variant, 1e-2);
        attn_case(&d, &mut r, 3, 72, &[77, 300, 5], 1.0, variant, 1e-2);
        attn_case(
            &d,
            &mut r,
            2,
            96,
            &[2704 / 4, 31, 128],
            96f32.powf(-0.5),
            variant,
            1e-2,
        );
        attn_case(&d, &mut r, 1, 72, &[1000], 1.0, variant, 1e-2);
        // blocks whose later query boxes lie wholly past the last token (the copy engine fills zeros)
        attn_case(
            &d,
            &mut r,
            2,
            96,
            &[3, 1300, 7],
            96f32.powf(-0.5),
            variant,
            1e-2,
        );
        attn_case(&d, &mut r, 2, 64, &[193, 2, 385], 0.125, variant, 1e-2);
    }
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
    attn_case_f32(&d, &mut r, 2, 64, &[1, 64, 200, 129], 0.125);
    attn_case_f32(&d, &mut r, 3, 72, &[77, 0, 300, 5], 1.0);
    attn_case_f32(&d, &mut r, 2, 96, &[2704 / 4, 31, 33], 96f32.powf(-0.5));
    attn_case_f32(&d, &mut r, 1, 72, &[1000], 1.0);
    attn_case_f32(&d, &mut r, 2, 128, &[95, 257], 128f32.powf(-0.5));
    attn_case_f32(&d, &mut r, 3, 40, &[3, 50], 0.2);
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

#[test]
#[ignore = "needs a CUDA device"]
fn layout_ops_match_host() {
    let d = dev();
    let mut r = Rng::new(6);
    // pos tables
    let (rows, h, t_rows) = (123usize, 72usize, 50usize);
    let x = r.vec(rows * h, 1.0);
    let table = r.vec(2 * t_rows * h, 1.0);
    let mut pos: Vec<i32> = (0..2 * rows)
        .map(|i| ((i * 7919) % t_rows) as i32)
        .collect();
    pos[10] = -1;
    pos[11] = -1;
    let mut want = x.clone();
    host::pos_add_xy(&mut want, h, &table, t_rows, &pos);
    let mut xd = d.upload(&x).unwrap();
    d.pos_add_xy(
        &mut xd,
        rows,
        h,
        &d.upload(&table).unwrap(),
        t_rows,
        &d.upload(&pos).unwrap(),
    )
    .unwrap();
    check("pos_add_xy", &d.download(&xd).unwrap(), &want, 1e-7);
    // bilinear: 52x52 -> 36x36 and -> 40x64 (up in one axis)
    let tab = r.vec(52 * 52 * 24, 1.0);
    let tabd = d.upload(&tab).unwrap();
    for (oh, ow) in [(36usize, 36usize), (40, 64), (52, 52)] {
        let mut o = d.alloc::<f32>(oh * ow * 24).unwrap();
        d.fill(&mut o, f32::NAN).unwrap();
        d.bilinear_resize(&tabd, 52, 52, &mut o, oh, ow, 24)
            .unwrap();
        check(
            &format!("bilinear 52x52->{oh}x{ow}"),
            &d.download(&o).unwrap(),
            &host::bilinear_resize(&tab, 52, 52, oh, ow, 24),
            1e-6,
        );
    }
    // avg pool 3x3 of a 42x57 grid
    let g = r.vec(42 * 57 * 16, 1.0);
    let mut o = d.alloc::<f32>(14 * 19 * 16).unwrap();
    d.fill(&mut o, f32::NAN).unwrap();
    d.avg_pool(&d.upload(&g).unwrap(), 42, 57, 3, 16, 4.0, &mut o)
        .unwrap();
    check(
        "avg_pool 3x3",
        &d.download(&o).unwrap(),
        &host::avg_pool(&g, 42, 57, 3, 16, 4.0),
        1e-6,
    );
    // 2x2 gather, block-major and raster
    let t = round_bf(&r.vec(8 * 6 * 20, 1.0));
    let td = d.upload(&to_bf(&t)).unwrap();
    for gw in [None, Some(6usize)] {
        let mut o = d.alloc::<bf16>(48 * 20).unwrap();
        d.fill(&mut o, bf16::NAN).unwrap();
        d.block_gather_2x2(&td, 48, 20, gw, &mut o).unwrap();
        check(
            &format!("block_gather_2x2 {gw:?}"),
            &from_bf(&d.download(&o).unwrap()),
            &host::block_gather_2x2(&t, 48, 20, gw),
            0.0,
        );
    }
    // im2col 3x3 s2 p1, odd and even grids, batch 2
    for (gh, gw) in [(9usize, 9usize), (10, 7)] {
        let c = 12;
        let t = round_bf(&r.vec(2 * gh * gw * c, 1.0));
        let (oh, ow) = (conv3x3s2_out(gh), conv3x3s2_out(gw));
        let mut o = d.alloc::<bf16>(2 * oh * ow * 9 * c).unwrap();
        d.fill(&mut o, bf16::NAN).unwrap();
        d.im2col_3x3s2(&d.upload(&to_bf(&t)).unwrap(), 2, gh, gw, c, &mut o)
            .unwrap();
        let got = from_bf(&d.download(&o).unwrap());
        let want = host::im2col_3x3s2(&t, 2, gh, gw, c);
        assert!(got.iter().all(|v| v.is_finite()));
        assert_eq!(got, want, "im2col {gh}x{gw}");
        println!("PARITY im2col {gh}x{gw}: exact");
    }
}

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
    qk_case(
        &d,
        &mut r,
        "gemma4 16 heads",
        (1001, 16, 72, 3 * w72),
        [0, w72, 2 * w72],
        all,
        cl,
        g4,
        true,
    );
    qk_case(
        &d,
        &mut r,
        "glm 16 heads",
        (777, 16, 64, 3 * w64),
        [0, w64, 2 * w64],
        [true, true, false],
        none,
        Some((RopeLayout::Glm, 36)),
        true,
    );
    qk_case(
        &d,
        &mut r,
        "step vendor 16 heads",
        (333, 16, 96, 3 * w96),
        [0, w96, 2 * w96],
        [false; 3],
        none,
        Some((RopeLayout::Step3p7Vendor, 52)),
        true,
    );
    qk_case(
        &d,
        &mut r,
        "step hf 16 heads",
        (333, 16, 96, 3 * w96),
        [0, w96, 2 * w96],
        [false; 3],
        none,
        Some((RopeLayout::Step3p7Hf, 52)),
        true,
    );
    qk_case(
        &d,
        &mut r,
        "padded",
        (23, 3, 72, 664),
        [8, 224, 448],
        all,
        cl,
        g4,
        true,
    );
    qk_case(
        &d,
        &mut r,
        "no rope",
        (17, 5, 40, 600),
        [0, 200, 400],
        all,
        none,
        None,
        true,
    );
    qk_case(
        &d,
        &mut r,
        "weightless",
        (17, 5, 40, 600),
        [0, 200, 400],
        all,
        none,
        g4,
        false,
    );
    qk_case(
        &d,
        &mut r,
        "k norm only, v clamp only",
        (19, 3, 64, 576),
        [0, 192, 384],
        [false, true, false],
        cl,
        Some((RopeLayout::Step3p7Hf, 5)),
        true,
    );
    qk_case(
        &d,
        &mut r,
        "general: odd stride",
        (11, 2, 72, 435),
        [1, 146, 291],
        all,
        cl,
        g4,
        true,
    );
    qk_case(
        &d,
        &mut r,
        "hd 36",
        (14, 3, 36, 324),
        [0, 108, 216],
        all,
        none,
        g4,
        true,
    );
    qk_case(
        &d,
        &mut r,
        "per head kd 80",
        (29, 1, 72, 480),
        [80, 240, 400],
        all,
        none,
        g4,
        true,
    );
    qk_case(
        &d,
        &mut r,
        "per head kd 76",
        (29, 1, 72, 456),
        [76, 228, 380],
        all,
        none,
        g4,
        true,
    );
    qk_case(
        &d,
        &mut r,
        "hd 256",
        (301, 2, 256, 1536),
        [0, 512, 1024],
        all,
        none,
        Some((RopeLayout::Glm, 17)),
        true,
    );
    qk_case(
        &d,
        &mut r,
        "hd 8",
        (40, 5, 8, 120),
        [0, 40, 80],
        all,
        none,
        Some((RopeLayout::Step3p7Vendor, 7)),
        true,
    );
    qk_case(
        &d,
        &mut r,
        "nothing to do",
        (5, 2, 64, 384),
        [0, 128, 256],
        [false; 3],
        none,
        None,
        true,
    );
}
