//! `cargo xtask gemma-check <repo> <case>` (formerly tower-gemma's `gemma-check` binary): loads an HF Gemma-4 checkpoint directory, runs the CUDA tower on
//! the image in `<case>` (written by `xtask/bench/gemma_fullsize.py`), prints rel-L2 against the
//! upstream rows, then times batch 1 and batch 8 with CUDA events (warm-up, median) and the
//! per-op cost of one layer at the same shapes.
//!
//! `<case>/meta.json` = `{"gw": .., "gh": ..}`; `pixels.f32` = `[gw·gh, 3p²]` little-endian f32;
//! `rows_f32.f32` = upstream float32 rows `[n, text_hidden]`; `rows_bf16.f32` (optional) = upstream
//! bf16 rows, for scale.
use std::error::Error;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use gpu_core::DeviceTower;
use gpu_core::{
    bf16, AttnArgs, Clamp, Epilogue, Gate, GemmInputs, GemmOutput, GemmShape, Mat, QkvSpec,
    RopeLayout, RopeSpec,
};
use tower_gemma::cuda::{Device, GpuError};
use tower_gemma::{CudaError, GemmaCuda, GemmaImage, GemmaTower, Precision};
use vision_towers::tower_core::rel_l2;

type Res<T> = std::result::Result<T, Box<dyn Error>>;

fn read_f32(path: &Path) -> Res<Vec<f32>> {
    let b = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if b.len() % 4 != 0 {
        return Err(format!(
            "{}: {} bytes is not a multiple of 4",
            path.display(),
            b.len()
        )
        .into());
    }
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn raster(gw: usize, gh: usize) -> Vec<i64> {
    (0..gw * gh)
        .flat_map(|i| [(i % gw) as i64, (i / gw) as i64])
        .collect()
}

fn rand_vec(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let u = (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32;
            lo + (hi - lo) * u
        })
        .collect()
}

fn gpu(e: CudaError) -> GpuError {
    match e {
        CudaError::Gpu(g) => g,
        other => GpuError::Shape {
            op: "gemma-check",
            what: other.to_string(),
        },
    }
}

fn median(v: &[f32]) -> f64 {
    v[v.len() / 2] as f64
}

/// Forward FLOPs of `images` images of `n` tokens each (GEMMs + attention; norms ignored).
fn flops(t: &GemmaTower, n: usize, images: usize) -> f64 {
    let c = &t.config;
    let (h, w, i, pd) = (
        c.hidden as f64,
        (c.heads * c.head_dim) as f64,
        c.intermediate as f64,
        c.patch_dim() as f64,
    );
    let n = n as f64;
    let np = n / (c.pool * c.pool) as f64;
    let per_tok = 2.0 * pd * h + c.layers as f64 * (2.0 * h * 3.0 * w + 2.0 * w * h + 6.0 * h * i);
    let attn = c.layers as f64 * 4.0 * n * n * w;
    images as f64 * (n * per_tok + attn + 2.0 * np * h * (h + c.text_hidden as f64))
}

fn main_with(args: &[String]) -> Res<()> {
    let [repo, case] = args else {
        return Err("usage: xtask gemma-check <checkpoint dir> <case dir>".into());
    };
    let case = Path::new(case);
    let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(case.join("meta.json"))?)?;
    let dim = |k: &str| -> Res<usize> {
        Ok(meta
            .get(k)
            .and_then(|v| v.as_u64())
            .ok_or_else(|| format!("meta.json: {k} missing"))? as usize)
    };
    let (gw, gh) = (dim("gw")?, dim("gh")?);
    let pixels = read_f32(&case.join("pixels.f32"))?;
    let up_f32 = read_f32(&case.join("rows_f32.f32"))?;
    let up_bf16 = read_f32(&case.join("rows_bf16.f32")).ok();

    let t0 = Instant::now();
    let ck = st_reader::Checkpoint::open(Path::new(repo))?;
    let tower = GemmaTower::from_checkpoint(&ck)?;
    let host_load = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let dev = Arc::new(Device::new(0)?);
    let dev_open = t1.elapsed().as_secs_f64();
    println!("device: {} ({} SMs)", dev.name()?, dev.multiprocessors()?);
    let c = tower.config.clone();
    println!(
        "config: H {} × {} layers, {} heads × {}, I {}, out {}, pool {}, pos rows {}, standardize {}, clipped {}",
        c.hidden, c.layers, c.heads, c.head_dim, c.intermediate, c.text_hidden, c.pool, c.pos_rows,
        c.standardize, c.clipped
    );
    let positions = raster(gw, gh);
    let img = GemmaImage {
        patches: &pixels,
        positions: &positions,
    };
    let mut summary: Vec<String> = Vec::new();

    // Exactness mode first (frees its f32 weights before the timing runs).
    let f32_check = || -> Res<f64> {
        let mut f = tower.to_cuda(dev.clone(), Precision::F32)?;
        let (rows, _) = f.encode(&[img], false)?;
        Ok(rel_l2(&rows[0], &up_f32))
    };
    match f32_check() {
        Ok(r) => {
            println!("cuda-f32  rows vs upstream f32: rel-L2 {r:.3e}");
            summary.push(format!(
                "| full-size rows, cuda-f32 vs upstream f32 | {r:.2e} |"
            ));
        }
        Err(e) => println!("cuda-f32 failed: {e}"),
    }
    let t2 = Instant::now();
    let mut g: GemmaCuda = tower.to_cuda(dev.clone(), Precision::Bf16)?;
    let upload = t2.elapsed().as_secs_f64();
    let (rows, _) = g.encode(&[img], false)?;
    let r = rel_l2(&rows[0], &up_f32);
    println!("cuda-bf16 rows vs upstream f32: rel-L2 {r:.3e} (bound 2e-2)");
    summary.push(format!(
        "| full-size rows, cuda-bf16 vs upstream f32 | {r:.2e} {} |",
        if r.is_finite() && r <= 2e-2 {
            "PASS"
        } else {
            "FAIL"
        }
    ));
    if let Some(b) = &up_bf16 {
        let rb = rel_l2(b, &up_f32);
        println!("upstream bf16 rows vs upstream f32: rel-L2 {rb:.3e} (for scale)");
        summary.push(format!(
            "| upstream bf16 vs upstream f32 (scale) | {rb:.2e} |"
        ));
        let ro = rel_l2(&rows[0], b);
        summary.push(format!(
            "| full-size rows, cuda-bf16 vs upstream bf16 | {ro:.2e} |"
        ));
    }
    println!(
        "weights on device (bf16 linears): {:.1} MiB; host load {host_load:.2} s, device open {dev_open:.2} s, upload {upload:.2} s",
        g.weight_bytes() as f64 / (1 << 20) as f64
    );

    // Padding-free batching: a mixed batch (42×57, 24×30, 42×57) gives each image the rows it
    // gets alone (only GEMM tiling for another m may change the accumulation order).
    {
        let small = rand_vec(24 * 30 * c.patch_dim(), 99, 0.0, 1.0);
        let small_pos = raster(24, 30);
        let b_img = GemmaImage {
            patches: &small,
            positions: &small_pos,
        };
        let (solo_b, _) = g.encode(&[b_img], false)?;
        let (mixed, _) = g.encode(&[img, b_img, img], false)?;
        let worst = [
            rel_l2(&mixed[0], &rows[0]),
            rel_l2(&mixed[1], &solo_b[0]),
            rel_l2(&mixed[2], &rows[0]),
        ];
        println!(
            "mixed batch vs solo: rel-L2 {:.2e} {:.2e} {:.2e}",
            worst[0], worst[1], worst[2]
        );
        let w = worst.iter().cloned().fold(0.0, f64::max);
        summary.push(format!(
            "| mixed batch [42×57, 24×30, 42×57] vs each alone (max) | {w:.2e} |"
        ));
    }

    // Timing: b1 (the upstream image) and b8 (eight random images of the same grid).
    let n = gw * gh;
    let others: Vec<Vec<f32>> = (1..8u64)
        .map(|s| rand_vec(pixels.len(), s, 0.0, 1.0))
        .collect();
    let mut imgs = vec![img];
    imgs.extend(others.iter().map(|p| GemmaImage {
        patches: p,
        positions: &positions,
    }));
    let mut table = Vec::new();
    for b in [1usize, 8] {
        let batch = g.prepare(&imgs[..b])?;
        g.run(&batch, false)?; // workspace + plans
        let t = dev.time_ms(3, 20, || g.run(&batch, false).map(|_| ()).map_err(gpu))?;
        let ms = median(&t);
        let tf = flops(&tower, n, b) / ms / 1e9;
        println!(
            "b{b}: median {ms:.3} ms (min {:.3}, max {:.3}), {:.1} images/s, {tf:.0} TFLOP/s",
            t[0],
            t[t.len() - 1],
            b as f64 * 1000.0 / ms
        );
        table.push((b, ms, tf));
    }

    // Per-op cost of one layer at the b1 and b8 shapes (random data), × layers.
    let (h, heads, hd, mi) = (c.hidden, c.heads, c.head_dim, c.intermediate);
    let wd = heads * hd;
    let d = &*dev;
    let mut ops_rows = Vec::new();
    for b in [1usize, 8] {
        let nt = n * b;
        let xs = d.upload(&rand_vec(nt * h, 11, -1.0, 1.0))?;
        let xb: Vec<bf16> = rand_vec(nt * mi, 12, -1.0, 1.0)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let xb = d.upload(&xb)?;
        let wq: Vec<bf16> = rand_vec(2 * mi * h, 13, -0.05, 0.05)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let wq = d.upload(&wq)?;
        let mut yb = d.alloc::<bf16>(nt * 2 * mi)?;
        let mut yf = d.alloc::<f32>(nt * h)?;
        let mut hn = d.alloc::<bf16>(nt * h)?;
        let mut xr = d.upload(&rand_vec(nt * h, 14, -1.0, 1.0))?;
        let ones = d.upload(&vec![1.0f32; h.max(hd)])?;
        let pos: Vec<i32> = (0..b)
            .flat_map(|_| raster(gw, gh))
            .map(|v| v as i32)
            .collect();
        let pos = d.upload(&pos)?;
        let inv = d.upload(&gpu_core::rope_inv_freq(hd, c.rope_theta))?;
        let cu: Vec<i32> = (0..=b).map(|i| (i * n) as i32).collect();
        let cud = d.upload(&cu)?;
        let mut qkv = d.upload(
            &rand_vec(nt * 3 * wd, 15, -1.0, 1.0)
                .into_iter()
                .map(bf16::from_f32)
                .collect::<Vec<_>>(),
        )?;
        let mut attn = d.alloc::<bf16>(nt * wd)?;
        let layers = c.layers as f64;
        let mut add = |name: &str, t: Vec<f32>| {
            ops_rows.push((b, name.to_string(), median(&t), median(&t) * layers));
        };
        let gemm = |n_out: usize, k: usize, y: &mut gpu_core::DeviceBuffer<bf16>| {
            d.gemm(
                GemmInputs::Bf16 { x: &xb, w: &wq },
                None,
                GemmOutput::Bf16(y),
                GemmShape::dense(nt, n_out, k),
                Epilogue::None,
            )
        };
        add("qkv gemm", d.time_ms(3, 10, || gemm(3 * wd, h, &mut yb))?);
        add(
            "mlp gate|up gemm",
            d.time_ms(3, 10, || gemm(2 * mi, h, &mut yb))?,
        );
        let gemm_f = |n_out: usize, k: usize, y: &mut gpu_core::DeviceBuffer<f32>| {
            d.gemm(
                GemmInputs::Bf16 { x: &xb, w: &wq },
                None,
                GemmOutput::F32(y),
                GemmShape::dense(nt, n_out, k),
                Epilogue::None,
            )
        };
        add(
            "o gemm (f32 out)",
            d.time_ms(3, 10, || gemm_f(h, wd, &mut yf))?,
        );
        add(
            "down gemm (f32 out)",
            d.time_ms(3, 10, || gemm_f(h, mi, &mut yf))?,
        );
        let spec = QkvSpec {
            tokens: nt,
            heads,
            head_dim: hd,
            ld: 3 * wd,
            offsets: [0, wd, 2 * wd],
            q_weight: Some(&ones),
            k_weight: Some(&ones),
            norm: [true; 3],
            eps: 1e-6,
            clamps: [Clamp::NONE; 3],
        };
        let rope = RopeSpec {
            layout: RopeLayout::Gemma4,
            pos: &pos,
            inv_freq: &inv,
        };
        add(
            "qk_norm_rope",
            d.time_ms(3, 10, || d.qk_norm_rope(&mut qkv, &spec, Some(&rope)))?,
        );
        let a = AttnArgs {
            q: (&qkv, Mat::strided(nt, wd, 3 * wd, 0)),
            k: (&qkv, Mat::strided(nt, wd, 3 * wd, wd)),
            v: (&qkv, Mat::strided(nt, wd, 3 * wd, 2 * wd)),
            heads,
            head_dim: hd,
            cu_seqlens: &cud,
            cu_seqlens_host: &cu,
            scale: 1.0,
            variant: None,
        };
        add(
            "flash_attn",
            d.time_ms(3, 10, || d.flash_attn(&a, &mut attn, Mat::dense(nt, wd)))?,
        );
        let m = Mat::dense(nt, h);
        add(
            "residual_rms_add+next (×2)",
            d.time_ms(3, 10, || {
                d.residual_rms_add(
                    &mut xr,
                    &xs,
                    m,
                    Some(&ones),
                    1e-6,
                    Clamp::NONE,
                    Some((Some(&ones), &mut hn, 1e-6)),
                )?;
                d.residual_rms_add(
                    &mut xr,
                    &xs,
                    m,
                    Some(&ones),
                    1e-6,
                    Clamp::NONE,
                    Some((Some(&ones), &mut hn, 1e-6)),
                )
            })?,
        );
        let gu = &yb;
        let mut out = d.alloc::<bf16>(nt * mi)?;
        add(
            "gated_act",
            d.time_ms(3, 10, || {
                d.gated_act(
                    &mut out,
                    Mat::dense(nt, mi),
                    gu,
                    Mat::strided(nt, mi, 2 * mi, 0),
                    gu,
                    Mat::strided(nt, mi, 2 * mi, mi),
                    Gate::plain(c.activation),
                )
            })?,
        );
    }
    println!("\nper-op (one layer, median ms; × layers):");
    for b in [1usize, 8] {
        let sum: f64 = ops_rows.iter().filter(|r| r.0 == b).map(|r| r.3).sum();
        for r in ops_rows.iter().filter(|r| r.0 == b) {
            println!(
                "  b{b} {:<28} {:>8.4} ms  ×{} = {:>7.3} ms ({:>4.1}%)",
                r.1,
                r.2,
                c.layers,
                r.3,
                100.0 * r.3 / sum
            );
        }
        println!("  b{b} sum of layer ops: {sum:.3} ms");
    }

    println!("\n| check | rel-L2 |\n|---|---|");
    for s in &summary {
        println!("{s}");
    }
    println!(
        "\n| case | ours ms | img/s | TFLOP/s (% of 786) | SDPA ms | compile ms | compile img/s |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (b, ms, tf) in table {
        let (sdpa, comp) = if b == 1 { (39.0, 14.9) } else { (138.4, 86.4) };
        println!(
            "| gemma4 42×57 b{b} | {ms:.2} | {:.1} | {tf:.0} ({:.0}%) | {sdpa} | {comp} | {:.1} |",
            b as f64 * 1000.0 / ms,
            100.0 * tf / 786.0,
            b as f64 * 1000.0 / comp
        );
    }
    Ok(())
}

/// Runs the check with `args` (the subcommand's arguments, see the module docs).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    main_with(args).map_err(|e| anyhow::anyhow!("{e}"))
}
