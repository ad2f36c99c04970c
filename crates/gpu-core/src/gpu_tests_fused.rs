//! Device-vs-host parity tests of the fused-epilogue GEMM ([`Device::gemm_act`]) and of
//! [`ActLinear`] on both of its paths. Each needs a CUDA device: `cargo xtask gpu-test` runs them.
//! On compute capability 9.0 the fused kernel must be there (a test fails, it does not skip).
use crate::gpu_tests::{check, dev, from_bf, round_bf, to_bf, Rng};
use crate::host;
use crate::*;

/// One bf16 rounding of the output on top of bf16 inputs: ~2e-3 rel-L2; the bound leaves room for the
/// approximate SFU functions and stays far below a wrong column order or a missing bias (≥ 1e-1).
const FUSED_BOUND: f64 = 6e-3;

/// Whether the device runs Hopper's tier (the sm_90a kernels): not on another card, nor on an H100
/// forced to an older tier.
fn is_hopper(d: &Device) -> bool {
    d.tier().arch.kernels == crate::tier::KernelSet::Hopper
}

fn plain(act: Activation) -> FusedAct {
    FusedAct::Plain {
        act,
        input: Clamp::NONE,
        output: Clamp::NONE,
    }
}

/// The epilogue variants the towers use (and their clamps), on odd shapes (rows, W rows and k not
/// multiples of the 128 × 256 × 64 tile) and on strided x / y.
#[test]
#[ignore = "needs a CUDA device"]
fn gemm_act_matches_host() {
    let d = dev();
    if !is_hopper(&d) {
        println!("gemm_act: no sm_90a kernel on this device (compute capability != 9.0)");
        assert!(!d.fused_gemm_supports(&plain(Activation::QuickGelu), 256, 64));
        return;
    }
    let mut r = Rng::new(21);
    let gemma = Gate {
        act: Activation::GeluTanh,
        gate_limit: f32::INFINITY,
        gate: Clamp::new(-2.5, 3.0),
        up: Clamp::new(-1.5, 1.25),
        out: Clamp::new(-0.75, 0.8),
    };
    let cases: Vec<(&str, usize, usize, usize, FusedAct, u8)> = vec![
        // (name, rows, W rows, k, act, bias: 0 none, 1 f32, 2 bf16)
        (
            "quick_gelu",
            1000,
            520,
            200,
            plain(Activation::QuickGelu),
            1,
        ),
        (
            "quick_gelu fc1-like",
            300,
            1792,
            1536,
            plain(Activation::QuickGelu),
            2,
        ),
        (
            "quick_gelu clamped",
            129,
            264,
            72,
            FusedAct::Plain {
                act: Activation::QuickGelu,
                input: Clamp::new(-1.0, 1.5),
                output: Clamp::new(-0.1, 0.9),
            },
            0,
        ),
        ("gelu_tanh plain", 64, 8, 8, plain(Activation::GeluTanh), 1),
        ("silu plain", 257, 776, 136, plain(Activation::Silu), 0),
        (
            "swiglu",
            777,
            272,
            136,
            FusedAct::Gated(Gate::swiglu_clamped(1.1)),
            2,
        ),
        (
            "swiglu glm-like",
            300,
            2048,
            1024,
            FusedAct::Gated(Gate::plain(Activation::Silu)),
            0,
        ),
        (
            "geglu gemma-like",
            333,
            2 * 1040,
            1152,
            FusedAct::Gated(gemma),
            0,
        ),
        ("geglu one tile", 17, 16, 16, FusedAct::Gated(gemma), 1),
    ];
    for (name, m, n, k, act, bias_kind) in cases {
        let x = round_bf(&r.vec(m * k, 1.0));
        let w = round_bf(&r.vec(n * k, 1.7 / (k as f32).sqrt()));
        let b = round_bf(&r.vec(n, 0.3));
        let bias = (bias_kind > 0).then_some(&b[..]);
        let want = host::gemm_act(&x, &w, bias, m, n, k, act);
        let cols = if matches!(act, FusedAct::Gated(_)) {
            n / 2
        } else {
            n
        };
        let (xd, wd) = (d.upload(&to_bf(&x)).unwrap(), d.upload(&to_bf(&w)).unwrap());
        let (bf, bb) = (d.upload(&b).unwrap(), d.upload(&to_bf(&b)).unwrap());
        let gb = match bias_kind {
            1 => Some(GemmBias::F32(&bf)),
            2 => Some(GemmBias::Bf16(&bb)),
            _ => None,
        };
        assert!(d.fused_gemm_supports(&act, n, k), "{name}: not supported");
        // dense
        let mut y = d.alloc::<bf16>(m * cols).unwrap();
        d.fill(&mut y, bf16::NAN).unwrap();
        d.gemm_act(
            &xd,
            Mat::dense(m, k),
            &wd,
            n,
            gb,
            &mut y,
            Mat::dense(m, cols),
            act,
        )
        .unwrap();
        let got = from_bf(&d.download(&y).unwrap());
        check(
            &format!("gemm_act {name} {m}x{n}x{k}"),
            &got,
            &want,
            FUSED_BOUND,
        );
        // strided and offset x and y (row starts on 16-byte boundaries); the pad columns stay untouched
        let (ldx, ldy, ox, oy) = (k + 24, cols + 40, 8 * k, 16);
        let mut xs = vec![bf16::from_f32(7.0); ox + m * ldx];
        for i in 0..m {
            xs[ox + i * ldx..ox + i * ldx + k].copy_from_slice(&to_bf(&x[i * k..(i + 1) * k]));
        }
        let xsd = d.upload(&xs).unwrap();
        let mut ys = d.alloc::<bf16>(oy + m * ldy).unwrap();
        d.fill(&mut ys, bf16::from_f32(-3.0)).unwrap();
        d.gemm_act(
            &xsd,
            Mat::strided(m, k, ldx, ox),
            &wd,
            n,
            gb,
            &mut ys,
            Mat::strided(m, cols, ldy, oy),
            act,
        )
        .unwrap();
        let all = from_bf(&d.download(&ys).unwrap());
        let mut got_s = Vec::with_capacity(m * cols);
        for i in 0..m {
            let row = &all[oy + i * ldy..oy + (i + 1) * ldy];
            got_s.extend_from_slice(&row[..cols]);
            assert!(
                row[cols..].iter().all(|v| *v == -3.0),
                "{name}: wrote past a row"
            );
        }
        assert!(
            all[..oy].iter().all(|v| *v == -3.0),
            "{name}: wrote before y"
        );
        assert_eq!(
            got_s, got,
            "{name}: strided result differs from the dense one"
        );
    }
}

/// What the kernel does not take is an error before any launch (never a wrong result).
#[test]
#[ignore = "needs a CUDA device"]
fn gemm_act_refuses_what_it_cannot_run() {
    let d = dev();
    if !is_hopper(&d) {
        return;
    }
    let gated = FusedAct::Gated(Gate::plain(Activation::Silu));
    assert!(
        !d.fused_gemm_supports(&plain(Activation::GeluErf), 256, 64),
        "no GELU-erf epilogue"
    );
    assert!(!d.fused_gemm_supports(&plain(Activation::Identity), 256, 64));
    assert!(
        !d.fused_gemm_supports(&gated, 264, 64),
        "gated W rows must be whole groups of 16"
    );
    assert!(
        !d.fused_gemm_supports(&plain(Activation::Silu), 256, 60),
        "k ≡ 0 mod 8"
    );
    assert!(d.fused_gemm_supports(&gated, 272, 64));
    let x = d.alloc::<bf16>(64 * 64 + 4).unwrap();
    let w = d.alloc::<bf16>(256 * 64).unwrap();
    let mut y = d.alloc::<bf16>(64 * 256 + 8).unwrap();
    let act = plain(Activation::Silu);
    let run = |xm: Mat, ym: Mat, y: &mut DeviceBuffer<bf16>| {
        d.gemm_act(&x, xm, &w, 256, None, y, ym, act)
    };
    // x row starts off 16-byte boundaries (offset 4 elements = 8 bytes)
    assert!(run(Mat::strided(64, 64, 64, 4), Mat::dense(64, 256), &mut y).is_err());
    // y stride not a multiple of 8 elements
    assert!(run(Mat::dense(32, 64), Mat::strided(32, 256, 260, 0), &mut y).is_err());
    // y's shape is not the product's
    assert!(run(Mat::dense(64, 64), Mat::dense(64, 128), &mut y).is_err());
    // buffers too short
    assert!(run(Mat::dense(65, 64), Mat::dense(65, 256), &mut y).is_err());
    let mut short = d.alloc::<bf16>(100).unwrap();
    assert!(run(Mat::dense(64, 64), Mat::dense(64, 256), &mut short).is_err());
    assert!(run(Mat::dense(64, 64), Mat::dense(64, 256), &mut y).is_ok());
}

/// ActLinear picks the fused kernel for a gated layer in bf16 on sm_90, the two-step path in f32 and for
/// a plain layer ([`fuses`]); both agree with the host on the stacked weight they were given.
#[test]
#[ignore = "needs a CUDA device"]
fn act_linear_paths_match_host() {
    let d = dev();
    let mut r = Rng::new(22);
    let (m, half, k) = (301usize, 520usize, 264usize);
    let n = 2 * half;
    let w = round_bf(&r.vec(n * k, 0.08));
    let b = round_bf(&r.vec(n, 0.2));
    let x = round_bf(&r.vec(m * k, 1.0));
    for act in [
        FusedAct::Gated(Gate::swiglu_clamped(0.9)),
        plain(Activation::QuickGelu),
    ] {
        let gated = matches!(act, FusedAct::Gated(_));
        let rows_w = if gated { n } else { half };
        let wv = &w[..rows_w * k];
        let bv = &b[..rows_w];
        let want = if gated {
            let y = host::gemm(&x, wv, Some(bv), m, n, k);
            let pick = |c0: usize| -> Vec<f32> {
                (0..m * half)
                    .map(|e| y[(e / half) * n + c0 + e % half])
                    .collect()
            };
            match act {
                FusedAct::Gated(g) => host::gated_act(&pick(0), &pick(half), g),
                FusedAct::Plain { .. } => unreachable!(),
            }
        } else {
            host::gemm_act(&x, wv, Some(bv), m, half, k, act)
        };
        for p in [Precision::Bf16, Precision::F32] {
            let mut st = Stager::new(&d).unwrap();
            let wsrc = wv.to_vec();
            let lin = ActLinear::upload(&mut st, &d, p, &wsrc, Some(bv), rows_w, k, act).unwrap();
            assert_eq!(
                lin.fused(),
                p == Precision::Bf16 && is_hopper(&d) && gated,
                "the fused path is taken exactly for gated layers in bf16 on sm_90"
            );
            let xb = GemmBuffer::upload(&d, p, &x).unwrap();
            let mut scratch = GemmBuffer::alloc(&d, p, m * rows_w).unwrap();
            let mut out = GemmBuffer::alloc(&d, p, m * rows_w).unwrap();
            lin.run(&d, &xb, m, Some(&mut scratch), &mut out).unwrap();
            let got = out.download_f32(&d, m * lin.out_cols()).unwrap();
            let bound = if p == Precision::F32 {
                1e-5
            } else {
                FUSED_BOUND
            };
            check(
                &format!("ActLinear {:?} {p:?} fused={}", act, lin.fused()),
                &got,
                &want,
                bound,
            );
        }
    }
}
