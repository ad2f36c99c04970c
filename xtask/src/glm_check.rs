//! `cargo xtask glm-check [iters]` (formerly tower-glm5's `glm-check` binary): times the glm5_next CUDA tower at full size (24 × 1024, 16 heads, ffn 4096,
//! merger 4096 → 10240 → 4096) on random bf16-rounded weights from a fixed seed, bf16 product mode:
//! 72×72 = 5184 patches b1, 96×128 = 12288 patches b1 and 8 × 5184 — CUDA events, 3 warm-ups,
//! median of `iters` (default 10) — with achieved TFLOP/s from the analytic FLOP count and the
//! upstream transformers anchors (`/work/shared/anchors/README.md`) beside. Also checks that image 0
//! of the batch-8 run gives the rows of the batch-1 run (segments kept apart).
//!
//! Exits 0 with "no device" on a machine without CUDA.
use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use gpu_core::bf16;
use gpu_core::DeviceTower;
use rayon::prelude::*;
use tower_glm5::cuda::{Device, GpuError};
use tower_glm5::{Block, GlmConfig, GlmCuda, GlmImage, GlmWeights, Linear, Precision};
use vision_towers::tower_core::rel_l2;

type Res<T> = std::result::Result<T, Box<dyn Error>>;

/// Uniform values in `[lo, hi)` from `seed`, bf16-rounded (the tower's product weights are bf16).
fn rand_vec(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    const CHUNK: usize = 1 << 16;
    let mut out = vec![0.0f32; n];
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(ci, c)| {
        let mut s = seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add((ci as u64).wrapping_mul(0xD1B5_4A32_D192_ED03))
            | 1;
        for v in c.iter_mut() {
            // splitmix64
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let u = (z >> 40) as f32 / (1u64 << 24) as f32;
            *v = bf16::from_f32(lo + (hi - lo) * u).to_f32();
        }
    });
    out
}

fn linear(out: usize, inp: usize, bias: bool, seed: u64) -> Linear {
    let a = 1.0 / (inp as f32).sqrt();
    Linear {
        w: rand_vec(out * inp, seed, -a, a),
        b: bias.then(|| rand_vec(out, seed ^ 0xB1A5, -0.02, 0.02)),
        out,
        inp,
    }
}

fn weights(c: &GlmConfig) -> GlmWeights {
    let (h, i, o, pi, hd) = (
        c.hidden,
        c.intermediate,
        c.text_hidden,
        c.merger_inner,
        c.head_dim,
    );
    let norm = |n: usize, s: u64| rand_vec(n, s, 0.8, 1.2);
    let blocks = (0..c.layers)
        .map(|l| {
            let s = 1000 + 100 * l as u64;
            Block {
                norm1: norm(h, s),
                norm2: norm(h, s + 1),
                qkv: linear(3 * h, h, true, s + 2),
                proj: linear(h, h, true, s + 3),
                q_norm: norm(hd, s + 4),
                k_norm: norm(hd, s + 5),
                gate: linear(i, h, true, s + 6),
                up: linear(i, h, true, s + 7),
                down: linear(h, i, true, s + 8),
            }
        })
        .collect();
    let u = c.merge_unit();
    GlmWeights {
        patch: linear(h, c.patch_dim(), true, 1),
        blocks,
        post_norm: norm(h, 2),
        downsample: linear(o, u * h, true, 3),
        merger_proj: linear(o, o, false, 4),
        merger_norm_w: norm(o, 5),
        merger_norm_b: rand_vec(o, 6, -0.02, 0.02),
        merger_gate: linear(pi, o, false, 7),
        merger_up: linear(pi, o, false, 8),
        merger_down: linear(o, pi, false, 9),
    }
}

/// Analytic FLOPs of one forward over `b` images of `n` patches each (GEMMs 2mnk, attention
/// 4·n²·hd·heads per segment), the count the anchors use.
fn flops(c: &GlmConfig, n: usize, b: usize) -> f64 {
    let (h, i, o, pi) = (
        c.hidden as f64,
        c.intermediate as f64,
        c.text_hidden as f64,
        c.merger_inner as f64,
    );
    let t = (n * b) as f64;
    let tp = t / c.merge_unit() as f64;
    let per_layer = 2.0 * t * h * (3.0 * h + h + 2.0 * i + i)
        + 4.0 * (n as f64).powi(2) * b as f64 * c.head_dim as f64 * c.heads as f64;
    2.0 * t * c.patch_dim() as f64 * h
        + c.layers as f64 * per_layer
        + 2.0 * tp * (c.merge_unit() as f64 * h) * o
        + 2.0 * tp * o * o
        + 2.0 * tp * o * 2.0 * pi
        + 2.0 * tp * pi * o
}

fn main_with(args: &[String]) -> Res<()> {
    let iters: usize = match args.first() {
        Some(s) => s.parse()?,
        None => 10,
    };
    let dev = match Device::new(0) {
        Ok(d) => Arc::new(d),
        Err(GpuError::NoDevice(why)) => {
            println!("no device: {why}");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    println!("device: {} ({} SMs)", dev.name()?, dev.multiprocessors()?);
    let cfg = GlmConfig::from_hf(&serde_json::json!({
        "model_type": "glm5_next",
        "vision_config": {
            "hidden_size": 1024, "depth": 24, "num_heads": 16, "intermediate_size": 4096,
            "out_hidden_size": 4096, "projection_intermediate_size": 10240,
            "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2
        }
    }))?;
    let t0 = Instant::now();
    let w = weights(&cfg);
    let t1 = Instant::now();
    let mut tower = GlmCuda::new(dev.clone(), &cfg, &w, Precision::Bf16)?;
    drop(w);
    println!(
        "weights: generated {:.1} s, uploaded {:.1} s, {:.0} MiB on the device",
        (t1 - t0).as_secs_f64(),
        t1.elapsed().as_secs_f64(),
        tower.weight_bytes() as f64 / (1 << 20) as f64
    );
    let pd = cfg.patch_dim();
    // (label, grid h, grid w, batch, anchor SDPA ms, anchor torch.compile ms)
    let cases = [
        ("72x72 b1", 72usize, 72usize, 1usize, 34.7f64, 20.9f64),
        ("96x128 b1", 96, 128, 1, 90.5, 59.4),
        ("72x72 b8", 72, 72, 8, 233.9, 137.3),
    ];
    let mut b1_rows: Option<Vec<f32>> = None;
    let mut table = Vec::new();
    for (label, gh, gw, b, sdpa, compiled) in cases {
        let n = gh * gw;
        let pixels: Vec<Vec<f32>> = (0..b)
            .map(|_| rand_vec(n * pd, 77 + gh as u64, -1.0, 1.0))
            .collect();
        let images: Vec<GlmImage<'_>> = pixels
            .iter()
            .map(|p| GlmImage {
                patches: p,
                grid_thw: [1, gh, gw],
            })
            .collect();
        let batch = tower.prepare(&images)?;
        tower.run(&batch, false)?;
        let rows = tower.rows(&batch)?;
        let finite = rows.iter().flatten().all(|v| v.is_finite());
        let consistency = match (&b1_rows, gh == 72 && gw == 72) {
            (None, true) => {
                b1_rows = Some(rows[0].clone());
                String::new()
            }
            (Some(r1), true) => format!(
                ", image 0 of b{b} vs b1 rel-L2 {:.2e}",
                rel_l2(&rows[0], r1)
            ),
            _ => String::new(),
        };
        // time_ms wants gpu-core's error: keep the tower's own error aside and stop on it.
        let mut failed: Option<tower_glm5::CudaError> = None;
        let times = dev.time_ms(3, iters, || {
            if failed.is_none() {
                if let Err(e) = tower.run(&batch, false) {
                    failed = Some(e);
                }
            }
            Ok(())
        })?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        let med = times[times.len() / 2] as f64;
        let f = flops(&cfg, n, b);
        let tflops = f / (med * 1e-3) / 1e12;
        println!(
            "{label}: {} patches, median {med:.2} ms (min {:.2}, max {:.2}), {:.1} img/s, {tflops:.0} TFLOP/s ({:.2} TFLOP), rows finite: {finite}{consistency}",
            n * b,
            times[0],
            times[times.len() - 1],
            b as f64 / (med * 1e-3),
            f / 1e12
        );
        table.push((
            label,
            n * b,
            med,
            b as f64 / (med * 1e-3),
            tflops,
            sdpa,
            compiled,
            b,
        ));
    }
    println!("\n| case | patches | ours ms | img/s | TFLOP/s | SDPA ms (img/s) | compile ms (img/s) | vs compile |");
    println!("|---|---|---|---|---|---|---|---|");
    for (label, p, med, ips, tf, sdpa, comp, b) in table {
        println!(
            "| {label} | {p} | {med:.1} | {ips:.1} | {tf:.0} | {sdpa} ({:.1}) | {comp} ({:.1}) | {:.2}× |",
            b as f64 / (sdpa * 1e-3),
            b as f64 / (comp * 1e-3),
            comp / med
        );
    }
    Ok(())
}

/// Runs the check with `args` (the subcommand's arguments, see the module docs).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    main_with(args).map_err(|e| anyhow::anyhow!("{e}"))
}
