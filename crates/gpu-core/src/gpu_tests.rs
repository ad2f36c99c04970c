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

pub(crate) fn dev() -> Device {
    Device::new(0).expect("a CUDA device")
}
pub(crate) fn to_bf(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|x| bf16::from_f32(*x)).collect()
}
pub(crate) fn from_bf(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}
/// bf16-rounded copy (the values the device actually sees).
pub(crate) fn round_bf(v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| bf16::from_f32(*x).to_f32()).collect()
}
pub(crate) fn check(name: &str, got: &[f32], want: &[f32], bound: f64) {
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

/// `DeviceOptions::poison_alloc` (`GPU_CORE_POISON_ALLOC=1`): every new buffer is 0xff bytes, NaN
/// in each float type and -1 in i32, whatever the allocator hands back (here a freed buffer's
/// block that held finite values).
#[test]
#[ignore = "needs a CUDA device"]
fn poison_alloc_fills_every_new_buffer_with_nan() {
    use crate::DeviceOptions;
    let d = Device::with_options(
        0,
        &DeviceOptions {
            poison_alloc: true,
            ..DeviceOptions::default()
        },
    )
    .unwrap();
    drop(d.upload(&vec![1.5f32; 4099]).unwrap());
    let f = d.alloc::<f32>(4099).unwrap();
    assert!(d
        .download(&f)
        .unwrap()
        .iter()
        .all(|v| v.to_bits() == u32::MAX));
    let b = d.alloc::<half::bf16>(77).unwrap();
    assert!(d.download(&b).unwrap().iter().all(|v| v.is_nan()));
    let h = d.alloc::<half::f16>(77).unwrap();
    assert!(d.download(&h).unwrap().iter().all(|v| v.is_nan()));
    let i = d.alloc::<i32>(33).unwrap();
    assert!(d.download(&i).unwrap().iter().all(|v| *v == -1));
    // rows a caller owns (and a stream's pass queue reads back) too
    for dtype in [crate::RowsDtype::F32, crate::RowsDtype::Bf16] {
        let rows = d.alloc_rows(1031, dtype).unwrap();
        d.mark_ready(&rows).unwrap();
        let bytes = rows.download_bytes().unwrap();
        assert_eq!(bytes.len(), 1031 * dtype.size());
        assert!(
            bytes.iter().all(|b| *b == 0xff),
            "{dtype:?} rows not poisoned"
        );
    }
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
