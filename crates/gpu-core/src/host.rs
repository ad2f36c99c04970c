//! Host twins of every device operation, in plain f32 with f64 accumulation where it is cheap.
//! Used by the unit tests and by the towers' host reference path. Layouts match the kernels
//! (row-major, channels last); see `kernels/README.md`.
use rayon::prelude::*;

use crate::ops::{Clamp, FusedAct, Gate, RopeLayout, GATE_UP_GROUP};
use crate::Activation;
pub use tower_core::rel_l2;

fn clamp(x: f32, c: Clamp) -> f32 {
    c.apply(x)
}

/// `n` deterministic values in [-1, 1) from `seed` (a multiplicative hash of the index): test
/// weights and activations that every crate's tests can rebuild without a random generator.
pub fn test_values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
        })
        .collect()
}

/// `y[m, n] = x[m, k]·W[n, k]ᵀ (+ b)`, f64 accumulation.
pub fn gemm(x: &[f32], w: &[f32], bias: Option<&[f32]>, m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; m * n];
    y.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        let xr = &x[i * k..(i + 1) * k];
        for (j, out) in row.iter_mut().enumerate() {
            let wr = &w[j * k..(j + 1) * k];
            let s: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
            *out = (s + bias.map_or(0.0, |b| b[j] as f64)) as f32;
        }
    });
    y
}

/// `act(x)` for one value (f64 inside).
pub fn activation(act: Activation, x: f32) -> f32 {
    let x = x as f64;
    let y = match act {
        Activation::GeluTanh => {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        }
        Activation::QuickGelu => x / (1.0 + (-1.702 * x).exp()),
        Activation::GeluErf => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::Identity => x,
    };
    y as f32
}

/// erf to about 1e-15 (Abramowitz–Stegun 7.1.26 is not enough for a reference): series / continued fraction.
pub fn erf(x: f64) -> f64 {
    if x < 0.0 {
        return -erf(-x);
    }
    if x < 2.5 {
        // Maclaurin series: erf x = 2/√π Σ (−1)^n x^(2n+1) / (n! (2n+1))
        let mut term = x;
        let mut sum = x;
        let x2 = x * x;
        for n in 1..80 {
            term *= -x2 / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc continued fraction (Lentz), accurate for x ≥ 2.5
        let mut f = x;
        let (mut c, mut d) = (x, 0.0f64);
        for n in 1..200 {
            let an = n as f64 / 2.0;
            d = x + an * d;
            d = 1.0 / d;
            c = x + an / c;
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        1.0 - (-x * x).exp() / (f * std::f64::consts::PI.sqrt())
    }
}

/// Gated activation on dense `[rows, cols]` gate/up.
pub fn gated_act(gate: &[f32], up: &[f32], g: Gate) -> Vec<f32> {
    gate.par_iter()
        .zip(up.par_iter())
        .map(|(&a, &u)| {
            let a = clamp(if a.is_nan() { a } else { a.min(g.gate_limit) }, g.gate);
            let u = clamp(u, g.up);
            clamp((activation(g.act, a) as f64 * u as f64) as f32, g.out)
        })
        .collect()
}

/// Plain activation.
pub fn act(x: &[f32], a: Activation, input: Clamp, output: Clamp) -> Vec<f32> {
    x.par_iter()
        .map(|&v| clamp(activation(a, clamp(v, input)), output))
        .collect()
}

/// [`crate::Device::gemm_act`]'s twin: `act(x·Wᵀ + b)` for `x [m, k]`, `W [n, k]`; gated, W's rows (and
/// the bias) are in the [`crate::interleave_gate_up`] order and the result is `[m, n/2]`.
pub fn gemm_act(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    m: usize,
    n: usize,
    k: usize,
    fa: FusedAct,
) -> Vec<f32> {
    let y = gemm(x, w, bias, m, n, k);
    match fa {
        FusedAct::Plain {
            act: a,
            input,
            output,
        } => act(&y, a, input, output),
        FusedAct::Gated(g) => {
            let half = n / 2;
            // output column i: gate at interleaved row 16·(i/8) + i%8, its up 8 rows further
            let col = |i: usize| 2 * GATE_UP_GROUP * (i / GATE_UP_GROUP) + i % GATE_UP_GROUP;
            let pick = |off: usize| -> Vec<f32> {
                (0..m * half)
                    .map(|e| y[(e / half) * n + col(e % half) + off])
                    .collect()
            };
            gated_act(&pick(0), &pick(GATE_UP_GROUP), g)
        }
    }
}

/// RMSNorm of dense rows of width h.
pub fn rms_norm(x: &[f32], h: usize, w: Option<&[f32]>, eps: f32, c: Clamp) -> Vec<f32> {
    let mut y = vec![0.0f32; x.len()];
    y.par_chunks_mut(h)
        .zip(x.par_chunks(h))
        .for_each(|(yr, xr)| {
            let ms = xr.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / h as f64;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            for j in 0..h {
                let v = xr[j] as f64 * inv * w.map_or(1.0, |w| w[j] as f64);
                yr[j] = clamp(v as f32, c);
            }
        });
    y
}

/// LayerNorm (biased variance) of dense rows of width h.
pub fn layer_norm(x: &[f32], h: usize, w: Option<&[f32]>, b: Option<&[f32]>, eps: f32) -> Vec<f32> {
    let mut y = vec![0.0f32; x.len()];
    y.par_chunks_mut(h)
        .zip(x.par_chunks(h))
        .for_each(|(yr, xr)| {
            let mean = xr.iter().map(|v| *v as f64).sum::<f64>() / h as f64;
            let var = xr.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / h as f64;
            let inv = 1.0 / (var + eps as f64).sqrt();
            for j in 0..h {
                let v = (xr[j] as f64 - mean) * inv * w.map_or(1.0, |w| w[j] as f64)
                    + b.map_or(0.0, |b| b[j] as f64);
                yr[j] = v as f32;
            }
        });
    y
}

/// `x += scale ⊙ clamp(y)` (dense, width h).
pub fn residual_add(x: &mut [f32], y: &[f32], h: usize, scale: Option<&[f32]>, c: Clamp) {
    x.par_chunks_mut(h)
        .zip(y.par_chunks(h))
        .for_each(|(xr, yr)| {
            for j in 0..h {
                xr[j] += clamp(yr[j], c) * scale.map_or(1.0, |s| s[j]);
            }
        });
}

/// gemma4 sandwich: `x += RMS(clamp(y))·w_post`; returns `RMS(x)·next_w` when `next` is given.
pub fn residual_rms_add(
    x: &mut [f32],
    y: &[f32],
    h: usize,
    w_post: Option<&[f32]>,
    eps: f32,
    c: Clamp,
    next: Option<(Option<&[f32]>, f32)>,
) -> Option<Vec<f32>> {
    let yc: Vec<f32> = y.iter().map(|v| clamp(*v, c)).collect();
    let n = rms_norm(&yc, h, w_post, eps, Clamp::NONE);
    for (a, b) in x.iter_mut().zip(&n) {
        *a += *b;
    }
    next.map(|(w, e)| rms_norm(x, h, w, e, Clamp::NONE))
}

/// Per-head RMSNorm + 2-D rope on a dense `[tokens, ld]` qkv (see [`crate::QkvSpec`]); `pos` is (x, y) per token.
#[allow(clippy::too_many_arguments)]
pub fn qk_norm_rope(
    qkv: &mut [f32],
    tokens: usize,
    heads: usize,
    hd: usize,
    ld: usize,
    offsets: [usize; 3],
    weights: [Option<&[f32]>; 2],
    norm: [bool; 3],
    eps: f32,
    clamps: [Clamp; 3],
    rope: Option<(RopeLayout, &[i32], &[f32])>,
) {
    qkv.par_chunks_mut(ld)
        .take(tokens)
        .enumerate()
        .for_each(|(t, row)| {
            for (which, &o) in offsets.iter().enumerate() {
                for h in 0..heads {
                    let v = &mut row[o + h * hd..o + (h + 1) * hd];
                    let mut b: Vec<f64> =
                        v.iter().map(|x| clamp(*x, clamps[which]) as f64).collect();
                    if norm[which] {
                        let ms = b.iter().map(|x| x * x).sum::<f64>() / hd as f64;
                        let inv = 1.0 / (ms + eps as f64).sqrt();
                        let w = if which < 2 { weights[which] } else { None };
                        for (j, x) in b.iter_mut().enumerate() {
                            *x = *x * inv * w.map_or(1.0, |w| w[j] as f64);
                        }
                    }
                    if let (Some((layout, pos, inv_freq)), true) = (rope, which < 2) {
                        let (px, py) = (pos[2 * t], pos[2 * t + 1]);
                        let (l, first) = layout.codes();
                        let (pa, pb) = if first == 0 { (px, py) } else { (py, px) };
                        let (q4, half) = (hd / 4, hd / 2);
                        let src = b.clone();
                        for p in 0..half {
                            let axis = usize::from(p >= q4);
                            let f = p - axis * q4;
                            // angle in f32 as the kernel and HF compute it (pos·inv_freq in f32)
                            let ang =
                                ((if axis == 0 { pa } else { pb }) as f32 * inv_freq[f]) as f64;
                            let (sn, cs) = ang.sin_cos();
                            let (i0, i1) = match l {
                                0 => (p, p + half),
                                1 => (axis * half + f, axis * half + f + q4),
                                _ => (2 * p, 2 * p + 1),
                            };
                            b[i0] = src[i0] * cs - src[i1] * sn;
                            b[i1] = src[i1] * cs + src[i0] * sn;
                        }
                    }
                    for (d, s) in v.iter_mut().zip(&b) {
                        *d = *s as f32;
                    }
                }
            }
        });
}

/// Reference attention, f64: `o[t, h·hd + d]` for dense q, k, v `[tokens, ld]` at column offsets,
/// segments from `cu_seqlens`, non-causal.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    ld: usize,
    offsets: [usize; 3],
    heads: usize,
    hd: usize,
    cu_seqlens: &[i32],
    scale: f32,
) -> Vec<f32> {
    let tokens = *cu_seqlens.last().unwrap() as usize;
    let width = heads * hd;
    let mut o = vec![0.0f32; tokens * width];
    let segs: Vec<(usize, usize)> = cu_seqlens
        .windows(2)
        .map(|w| (w[0] as usize, w[1] as usize))
        .collect();
    o.par_chunks_mut(width).enumerate().for_each(|(t, orow)| {
        let &(s0, s1) = segs.iter().find(|(a, b)| t >= *a && t < *b).unwrap();
        let mut sc = vec![0.0f64; s1 - s0];
        for h in 0..heads {
            let qr = &q[t * ld + offsets[0] + h * hd..][..hd];
            let mut mx = f64::NEG_INFINITY;
            for (j, s) in sc.iter_mut().enumerate() {
                let kr = &k[(s0 + j) * ld + offsets[1] + h * hd..][..hd];
                *s = qr
                    .iter()
                    .zip(kr)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>()
                    * scale as f64;
                mx = mx.max(*s);
            }
            let mut sum = 0.0;
            for s in sc.iter_mut() {
                *s = (*s - mx).exp();
                sum += *s;
            }
            for d in 0..hd {
                let mut acc = 0.0f64;
                for (j, p) in sc.iter().enumerate() {
                    acc += p * v[(s0 + j) * ld + offsets[2] + h * hd + d] as f64;
                }
                orow[h * hd + d] = (acc / sum) as f32;
            }
        }
    });
    o
}

/// gemma4 position tables: `x[r] += T[0, px] + T[1, py]` unless a position is negative or ≥ t_rows.
pub fn pos_add_xy(x: &mut [f32], h: usize, table: &[f32], t_rows: usize, pos: &[i32]) {
    x.par_chunks_mut(h).enumerate().for_each(|(r, xr)| {
        let (px, py) = (pos[2 * r], pos[2 * r + 1]);
        if px < 0 || py < 0 || px as usize >= t_rows || py as usize >= t_rows {
            return;
        }
        for c in 0..h {
            xr[c] += table[px as usize * h + c] + table[(t_rows + py as usize) * h + c];
        }
    });
}

fn src_index(dst: usize, in_size: usize, out_size: usize) -> (usize, usize, f32) {
    // torch area_pixel_compute_source_index (align_corners=false), in f32
    let scale = in_size as f32 / out_size as f32;
    let s = (scale * (dst as f32 + 0.5) - 0.5).max(0.0);
    let i0 = s as usize;
    let i1 = i0 + usize::from(i0 < in_size - 1);
    (i0, i1, s - i0 as f32)
}

/// Bilinear resize (align_corners = false) of `[ih, iw, h]` to `[oh, ow, h]`.
pub fn bilinear_resize(
    input: &[f32],
    ih: usize,
    iw: usize,
    oh: usize,
    ow: usize,
    h: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; oh * ow * h];
    out.par_chunks_mut(h).enumerate().for_each(|(p, o)| {
        let (oy, ox) = (p / ow, p % ow);
        let (y0, y1, ly) = src_index(oy, ih, oh);
        let (x0, x1, lx) = src_index(ox, iw, ow);
        for c in 0..h {
            let g = |y: usize, x: usize| input[(y * iw + x) * h + c] as f64;
            let (ly, lx) = (ly as f64, lx as f64);
            o[c] = ((1.0 - ly) * ((1.0 - lx) * g(y0, x0) + lx * g(y0, x1))
                + ly * ((1.0 - lx) * g(y1, x0) + lx * g(y1, x1))) as f32;
        }
    });
    out
}

/// k×k average pool of `[gh, gw, h]` to `[gh/k, gw/k, h]`, times `scale`.
pub fn avg_pool(input: &[f32], gh: usize, gw: usize, k: usize, h: usize, scale: f32) -> Vec<f32> {
    let (ph, pw) = (gh / k, gw / k);
    let mut out = vec![0.0f32; ph * pw * h];
    out.par_chunks_mut(h).enumerate().for_each(|(p, o)| {
        let (py, px) = (p / pw, p % pw);
        for c in 0..h {
            let mut s = 0.0f64;
            for dy in 0..k {
                for dx in 0..k {
                    s += input[((py * k + dy) * gw + px * k + dx) * h + c] as f64;
                }
            }
            o[c] = (s / (k * k) as f64 * scale as f64) as f32;
        }
    });
    out
}

/// 2×2 merge gather (see [`crate::Device::block_gather_2x2`]).
pub fn block_gather_2x2(input: &[f32], tokens: usize, h: usize, grid_w: Option<usize>) -> Vec<f32> {
    let mut out = vec![0.0f32; tokens * h];
    for b in 0..tokens / 4 {
        for c in 0..h {
            for ky in 0..2 {
                for kx in 0..2 {
                    let tok = match grid_w {
                        None => 4 * b + 2 * ky + kx,
                        Some(gw) => {
                            let bw = gw / 2;
                            (2 * (b / bw) + ky) * gw + 2 * (b % bw) + kx
                        }
                    };
                    out[b * 4 * h + c * 4 + ky * 2 + kx] = input[tok * h + c];
                }
            }
        }
    }
    out
}

/// 3×3 stride-2 pad-1 im2col (see [`crate::Device::im2col_3x3s2`]).
pub fn im2col_3x3s2(input: &[f32], batch: usize, gh: usize, gw: usize, c: usize) -> Vec<f32> {
    let (oh, ow) = ((gh - 1) / 2 + 1, (gw - 1) / 2 + 1);
    let mut out = vec![0.0f32; batch * oh * ow * 9 * c];
    for b in 0..batch {
        for oy in 0..oh {
            for ox in 0..ow {
                let r = (b * oh + oy) * ow + ox;
                for ch in 0..c {
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (y, x) = ((2 * oy + ky) as isize - 1, (2 * ox + kx) as isize - 1);
                            let v = if y >= 0 && (y as usize) < gh && x >= 0 && (x as usize) < gw {
                                input[((b * gh + y as usize) * gw + x as usize) * c + ch]
                            } else {
                                0.0
                            };
                            out[r * 9 * c + ch * 9 + ky * 3 + kx] = v;
                        }
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host twins keep a NaN through every clamp and the gate limit, as torch.clamp does
    /// (before, `f32::max`/`min` returned the bound: this test failed on the gate limit and clamps).
    #[test]
    fn clamped_twins_keep_nan() {
        let g = Gate {
            gate: Clamp::new(-3.0, 2.5),
            up: Clamp::new(-1.0, 4.0),
            out: Clamp::new(-2.0, 2.0),
            ..Gate::swiglu_clamped(2.0)
        };
        let y = gated_act(&[f32::NAN, 0.5, 0.5], &[0.5, f32::NAN, 0.5], g);
        assert!(y[0].is_nan() && y[1].is_nan() && y[2].is_finite(), "{y:?}");
        let c = Clamp::new(-1.0, 1.0);
        let a = act(&[f32::NAN, 3.0], Activation::Silu, c, c);
        assert!(
            a[0].is_nan() && a[1] == 1.0f32.min(activation(Activation::Silu, 1.0)),
            "{a:?}"
        );
        let n = rms_norm(&[f32::NAN, 1.0, 2.0, 3.0], 2, None, 1e-6, c);
        assert!(n[0].is_nan() && n[1].is_nan() && n[2].is_finite(), "{n:?}");
    }

    /// The fused twin on an interleaved weight is the two-step law on the stacked one, exactly.
    #[test]
    fn gemm_act_twin_is_gemm_then_activation() {
        let (m, half, k) = (5usize, 16usize, 7usize);
        let n = 2 * half;
        let val = |i: usize, s: f32| ((i * 37 % 23) as f32 - 11.0) * s;
        let x: Vec<f32> = (0..m * k).map(|i| val(i, 0.1)).collect();
        let w: Vec<f32> = (0..n * k).map(|i| val(i + 5, 0.07)).collect();
        let b: Vec<f32> = (0..n).map(|i| val(i + 9, 0.02)).collect();
        let g = Gate {
            act: Activation::GeluTanh,
            gate_limit: 0.5,
            gate: Clamp::new(-1.0, 2.0),
            up: Clamp::new(-0.3, 0.3),
            out: Clamp::new(-0.2, 0.25),
        };
        let y = gemm(&x, &w, Some(&b), m, n, k);
        let cols = |c0: usize| -> Vec<f32> {
            (0..m * half)
                .map(|e| y[(e / half) * n + c0 + e % half])
                .collect()
        };
        let want = gated_act(&cols(0), &cols(half), g);
        let wi = crate::interleave_gate_up(&w, half, k).unwrap();
        let bi = crate::interleave_gate_up(&b, half, 1).unwrap();
        assert_eq!(
            gemm_act(&x, &wi, Some(&bi), m, n, k, FusedAct::Gated(g)),
            want
        );
        let plain = FusedAct::Plain {
            act: Activation::QuickGelu,
            input: Clamp::new(-1.0, 1.0),
            output: Clamp::NONE,
        };
        let want = act(
            &y,
            Activation::QuickGelu,
            Clamp::new(-1.0, 1.0),
            Clamp::NONE,
        );
        assert_eq!(gemm_act(&x, &w, Some(&b), m, n, k, plain), want);
    }

    #[test]
    fn erf_matches_known_values() {
        // erf(0.5), erf(1), erf(2), erf(3) to 1e-12 (Abramowitz & Stegun table 7.1)
        for (x, want) in [
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 0.999_977_909_503_001_4),
        ] {
            assert!((erf(x) - want).abs() < 1e-12, "erf({x}) = {}", erf(x));
            assert!((erf(-x) + want).abs() < 1e-12);
        }
    }

    #[test]
    fn activations_match_closed_forms() {
        assert!((activation(Activation::GeluErf, 1.0) - 0.841_344_8).abs() < 1e-6);
        assert!((activation(Activation::GeluTanh, 1.0) - 0.841_192).abs() < 1e-5);
        assert!(
            (activation(Activation::QuickGelu, 1.0) - 1.0 / (1.0 + (-1.702f32).exp())).abs() < 1e-6
        );
        assert!((activation(Activation::Silu, -2.0) - (-2.0 / (1.0 + 2f32.exp()))).abs() < 1e-6);
        let g = gated_act(&[20.0, -3.0], &[20.0, 0.5], Gate::swiglu_clamped(10.0));
        assert!((g[0] - activation(Activation::Silu, 10.0) * 10.0).abs() < 1e-4);
    }

    #[test]
    fn rope_layouts_are_rotations_of_the_right_pairs() {
        // hd 8, one head, q only at offset 0; token at x = 1, y = 2; inv_freq = [1, 0.5]
        let inv = [1.0f32, 0.5];
        let base: Vec<f32> = (1..=8).map(|v| v as f32).collect();
        let run = |layout| {
            let mut q = base.clone();
            q.extend(vec![0.0; 16]);
            qk_norm_rope(
                &mut q,
                1,
                1,
                8,
                24,
                [0, 8, 16],
                [None, None],
                [false; 3],
                1e-6,
                [Clamp::NONE; 3],
                Some((layout, &[1, 2], &inv)),
            );
            q[..8].to_vec()
        };
        let rot = |a: f32, b: f32, ang: f32| {
            (a * ang.cos() - b * ang.sin(), b * ang.cos() + a * ang.sin())
        };
        // NeoX full, x first (step HF): pairs (0,4) ang 1·1, (1,5) 1·.5, (2,6) 2·1, (3,7) 2·.5
        let o = run(RopeLayout::Step3p7Hf);
        for (p, ang) in [(0usize, 1.0f32), (1, 0.5), (2, 2.0), (3, 1.0)] {
            let (a, b) = rot(base[p], base[p + 4], ang);
            assert!(
                (o[p] - a).abs() < 1e-5 && (o[p + 4] - b).abs() < 1e-5,
                "neox pair {p}"
            );
        }
        // glm: y first, so the angles of the two axes swap
        let o = run(RopeLayout::Glm);
        let (a, _) = rot(base[0], base[4], 2.0);
        assert!((o[0] - a).abs() < 1e-5);
        // gemma halves: pairs (0,2),(1,3) by x, (4,6),(5,7) by y
        let o = run(RopeLayout::Gemma4);
        for (i0, i1, ang) in [
            (0usize, 2usize, 1.0f32),
            (1, 3, 0.5),
            (4, 6, 2.0),
            (5, 7, 1.0),
        ] {
            let (a, b) = rot(base[i0], base[i1], ang);
            assert!(
                (o[i0] - a).abs() < 1e-5 && (o[i1] - b).abs() < 1e-5,
                "gemma pair {i0}"
            );
        }
        // interleaved: (0,1),(2,3) by x, (4,5),(6,7) by y
        let o = run(RopeLayout::Step3p7Vendor);
        for (i0, ang) in [(0usize, 1.0f32), (2, 0.5), (4, 2.0), (6, 1.0)] {
            let (a, b) = rot(base[i0], base[i0 + 1], ang);
            assert!(
                (o[i0] - a).abs() < 1e-5 && (o[i0 + 1] - b).abs() < 1e-5,
                "interleaved pair {i0}"
            );
        }
    }

    #[test]
    fn step3p7_vendor_and_hf_layouts_agree_under_the_permutation() {
        // HF row s·hd/2 + i = vendor row 2i + s (UPSTREAM_SPEC 4.4)
        let hd = 96;
        let inv = crate::rope_inv_freq(hd, 10000.0);
        let vendor: Vec<f32> = (0..hd)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3)
            .collect();
        let mut hf = vec![0.0f32; hd];
        for i in 0..hd / 2 {
            for s in 0..2 {
                hf[s * hd / 2 + i] = vendor[2 * i + s];
            }
        }
        let pos = [7, 3];
        let mut v = vendor.clone();
        v.extend(vec![0.0; 2 * hd]);
        let mut h = hf.clone();
        h.extend(vec![0.0; 2 * hd]);
        let off = [0, hd, 2 * hd];
        qk_norm_rope(
            &mut v,
            1,
            1,
            hd,
            3 * hd,
            off,
            [None, None],
            [false; 3],
            0.0,
            [Clamp::NONE; 3],
            Some((RopeLayout::Step3p7Vendor, &pos, &inv)),
        );
        qk_norm_rope(
            &mut h,
            1,
            1,
            hd,
            3 * hd,
            off,
            [None, None],
            [false; 3],
            0.0,
            [Clamp::NONE; 3],
            Some((RopeLayout::Step3p7Hf, &pos, &inv)),
        );
        for i in 0..hd / 2 {
            for s in 0..2 {
                assert!((h[s * hd / 2 + i] - v[2 * i + s]).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn attention_rows_are_convex_combinations_of_v() {
        let (hd, heads, ld) = (4, 1, 12);
        let qkv: Vec<f32> = (0..3 * ld).map(|i| ((i * 7 % 5) as f32) * 0.1).collect();
        let o = attention(&qkv, &qkv, &qkv, ld, [0, 4, 8], heads, hd, &[0, 1, 3], 1.0);
        // token 0 is alone in its segment: o = v[0]
        for d in 0..hd {
            assert!((o[d] - qkv[8 + d]).abs() < 1e-6);
        }
    }

    #[test]
    fn bilinear_identity_and_avg_pool_and_im2col_shapes() {
        let t: Vec<f32> = (0..2 * 3 * 5).map(|v| v as f32).collect();
        assert_eq!(bilinear_resize(&t, 2, 3, 2, 3, 5), t);
        let p = avg_pool(
            &(0..16).map(|v| v as f32).collect::<Vec<_>>(),
            4,
            4,
            2,
            1,
            1.0,
        );
        assert_eq!(p, vec![2.5, 4.5, 10.5, 12.5]);
        let i = im2col_3x3s2(&[1.0; 9], 1, 3, 3, 1);
        assert_eq!(i.len(), 4 * 9);
        assert_eq!(&i[..9], &[0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]);
    }
}
