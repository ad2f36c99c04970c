//! A NaN reaching a clamp stays NaN, as torch.clamp keeps it (the oracle's law), on every kernel that
//! clamps: the gated and plain activations (vector and scalar paths), the RMS norm's output clamp
//! and the sm_90a fused GEMM's epilogue. Before the kernels' `clampf` kept NaN, `fminf`/`fmaxf`
//! turned it into the clamp's bound, so an f16 overflow upstream of gemma4's clipped linears would
//! have left finite, wrong rows that no finiteness check could see.
use crate::gpu_tests::{dev, from_bf, round_bf, to_bf, Rng};
use crate::host;
use crate::*;

/// `want`'s NaN positions are exactly `got`'s, and every other value is finite.
fn same_nans(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let wrong: Vec<usize> = (0..got.len())
        .filter(|&i| {
            got[i].is_nan() != want[i].is_nan() || !(got[i].is_nan() || got[i].is_finite())
        })
        .take(4)
        .collect();
    let nans = want.iter().filter(|v| v.is_nan()).count();
    assert!(
        nans > 0,
        "{name}: the host twin has no NaN (the test would prove nothing)"
    );
    assert!(
        wrong.is_empty(),
        "{name}: NaN not kept at {wrong:?} (got {:?}, want {:?}); {nans} NaN expected",
        wrong.iter().map(|&i| got[i]).collect::<Vec<_>>(),
        wrong.iter().map(|&i| want[i]).collect::<Vec<_>>()
    );
}

/// `n` values with a NaN planted every `every` elements, starting at `first`.
fn with_nans(r: &mut Rng, n: usize, a: f32, first: usize, every: usize) -> Vec<f32> {
    let mut v = round_bf(&r.vec(n, a));
    for x in v.iter_mut().skip(first).step_by(every) {
        *x = f32::NAN;
    }
    v
}

#[test]
#[ignore = "needs a CUDA device"]
fn clamps_keep_nan() {
    let d = dev();
    let mut r = Rng::new(41);
    let gates = [
        Gate::swiglu_clamped(2.0),
        Gate {
            gate: Clamp::new(-3.0, 2.5),
            up: Clamp::new(-1.0, 4.0),
            out: Clamp::new(-2.0, 2.0),
            ..Gate::plain(Activation::GeluTanh)
        },
    ];
    // 64 columns take the 16-byte vector path, 61 the scalar one
    for cols in [64usize, 61] {
        let rows = 9usize;
        let gate = with_nans(&mut r, rows * cols, 6.0, 5, 37);
        let up = with_nans(&mut r, rows * cols, 6.0, 11, 53);
        let m = Mat::dense(rows, cols);
        for g in gates {
            let want = host::gated_act(&gate, &up, g);
            let (gd, ud) = (
                d.upload(&to_bf(&gate)).unwrap(),
                d.upload(&to_bf(&up)).unwrap(),
            );
            let mut out = d.alloc::<bf16>(rows * cols).unwrap();
            d.gated_act(&mut out, m, &gd, m, &ud, m, g).unwrap();
            same_nans(
                &format!("gated_act bf16 {g:?} {rows}x{cols}"),
                &from_bf(&d.download(&out).unwrap()),
                &want,
            );
            let (gf, uf) = (d.upload(&gate).unwrap(), d.upload(&up).unwrap());
            let mut outf = d.alloc::<f32>(rows * cols).unwrap();
            d.gated_act(&mut outf, m, &gf, m, &uf, m, g).unwrap();
            same_nans(
                &format!("gated_act f32 {g:?} {rows}x{cols}"),
                &d.download(&outf).unwrap(),
                &want,
            );
        }
        let (ci, co) = (Clamp::new(-4.0, 5.0), Clamp::new(-3.0, 3.0));
        let want = host::act(&gate, Activation::GeluTanh, ci, co);
        let mut x = d.upload(&to_bf(&gate)).unwrap();
        d.act_in_place(&mut x, m, Activation::GeluTanh, ci, co)
            .unwrap();
        same_nans(
            &format!("act bf16 {rows}x{cols}"),
            &from_bf(&d.download(&x).unwrap()),
            &want,
        );
    }
    // a NaN in a row makes that whole row NaN before the output clamp (the sum of squares)
    let (rows, h) = (5usize, 1152usize);
    let mut x = r.vec(rows * h, 3.0);
    x[2 * h + 17] = f32::NAN;
    let xd = d.upload(&x).unwrap();
    let m = Mat::dense(rows, h);
    let c = Clamp::new(-1.0, 1.5);
    let mut y = d.alloc::<bf16>(rows * h).unwrap();
    d.rms_norm(&xd, m, None, &mut y, m, 1e-5, c).unwrap();
    same_nans(
        "rms_norm clamp bf16",
        &from_bf(&d.download(&y).unwrap()),
        &host::rms_norm(&x, h, None, 1e-5, c),
    );
    // the fused GEMM's epilogue (sm_90a only): a NaN in row 3 of x reaches every output of row 3
    if d.tier().arch.kernels == crate::tier::KernelSet::Hopper {
        let (m, n, k) = (130usize, 256usize, 64usize);
        let mut xv = round_bf(&r.vec(m * k, 1.0));
        xv[3 * k + 7] = f32::NAN;
        let w = round_bf(&r.vec(n * k, 0.2));
        let gemma = Gate {
            act: Activation::GeluTanh,
            gate_limit: 2.0,
            gate: Clamp::new(-2.5, 3.0),
            up: Clamp::new(-1.5, 1.25),
            out: Clamp::new(-0.75, 0.8),
        };
        let act = FusedAct::Gated(gemma);
        assert!(d.fused_gemm_supports(&act, n, k));
        let (xd, wd) = (
            d.upload(&to_bf(&xv)).unwrap(),
            d.upload(&to_bf(&w)).unwrap(),
        );
        let mut y = d.alloc::<bf16>(m * n / 2).unwrap();
        d.gemm_act(
            &xd,
            Mat::dense(m, k),
            &wd,
            n,
            None,
            &mut y,
            Mat::dense(m, n / 2),
            act,
        )
        .unwrap();
        same_nans(
            "gemm_act gated epilogue",
            &from_bf(&d.download(&y).unwrap()),
            &host::gemm_act(&xv, &w, None, m, n, k, act),
        );
    }
}
