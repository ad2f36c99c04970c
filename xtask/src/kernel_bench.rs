//! `cargo xtask kernel-bench` (formerly gpu-core's `gpu-core-bench` binary): kernel timings on the GPU machine (CUDA events, warm-up, median).
//! Prints one table; every row: case, median ms, achieved rate, and the rate's unit; memory-bound
//! rows also give the bytes moved and the share of the measured device-to-device copy bandwidth.
use gpu_core::*;

/// One row of the final table.
struct Row {
    case: String,
    ms: f64,
    rate: f64,
    unit: &'static str,
    /// Memory-bound kernels: (MB moved, % of the copy bandwidth).
    mem: Option<(f64, f64)>,
}

/// A row without the memory columns (compute-bound kernels).
fn plain(case: String, ms: f64, rate: f64, unit: &'static str) -> Row {
    Row {
        case,
        ms,
        rate,
        unit,
        mem: None,
    }
}

fn rand_f32(n: usize, a: f32, seed: u64) -> Vec<f32> {
    rand_bf(n, a, seed).iter().map(|v| v.to_f32()).collect()
}

/// Device-to-device copy of 4 GiB (bytes read + written): (median ms, GB/s).
fn measure_copy(d: &Device) -> Result<(f64, f64)> {
    let n = 1usize << 30; // 1 Gi f32 = 4 GiB
    let a = d.alloc::<f32>(n)?;
    let mut b = d.alloc::<f32>(n)?;
    let t = d.time_ms(2, 10, || d.copy(&a, &mut b))?;
    Ok((median(&t), 2.0 * 4.0 * n as f64 / median(&t) / 1e6))
}

fn rand_bf(n: usize, a: f32, seed: u64) -> Vec<bf16> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let v = (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32
                * 2.0
                - 1.0;
            bf16::from_f32(v * a)
        })
        .collect()
}

fn median(v: &[f32]) -> f64 {
    v[v.len() / 2] as f64
}

fn main_with() -> Result<()> {
    let d = Device::new(0)?;
    println!(
        "device: {} (sm {:?}, {} SMs)",
        d.name()?,
        d.compute_capability()?,
        d.multiprocessors()?
    );
    let mut rows: Vec<Row> = Vec::new();
    let mut copy_gbs = None;
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();

    // floors: D2D copy bandwidth and bf16 GEMM peak
    if only.is_empty() || only.contains("floor") {
        let (ms, gbs) = measure_copy(&d)?;
        copy_gbs = Some(gbs);
        rows.push(Row {
            case: "floor: D2D copy 4 GiB".into(),
            ms,
            rate: gbs,
            unit: "GB/s",
            mem: Some((8.0 * (1u64 << 30) as f64 / 1e6, 100.0)),
        });
        let s = 8192;
        let x = d.upload(&rand_bf(s * s, 1.0, 1))?;
        let w = d.upload(&rand_bf(s * s, 1.0, 2))?;
        let mut y = d.alloc::<bf16>(s * s)?;
        let t = d.time_ms(3, 10, || {
            d.gemm(
                GemmInputs::Bf16 { x: &x, w: &w },
                None,
                GemmOutput::Bf16(&mut y),
                GemmShape::dense(s, s, s),
                Epilogue::None,
            )
        })?;
        rows.push(plain(
            "floor: GEMM bf16 8192^3".into(),
            median(&t),
            2.0 * (s as f64).powi(3) / median(&t) / 1e9,
            "TFLOP/s",
        ));
    }

    // tower GEMMs, y = x·Wᵀ (+bias), bf16 out
    if only.is_empty() || only.contains("gemm") {
        for &(name, m, n, k) in &[
            ("step fc1 2704x8960x1536", 2704usize, 8960usize, 1536usize),
            ("step fc2 2704x1536x8960", 2704, 1536, 8960),
            ("gemma gate 2394x4304x1152", 2394, 4304, 1152),
            ("gemma q 2394x1152x1152", 2394, 1152, 1152),
            ("glm qkv 5184x3072x1024", 5184, 3072, 1024),
        ] {
            let x = d.upload(&rand_bf(m * k, 1.0, 3))?;
            let w = d.upload(&rand_bf(n * k, 0.05, 4))?;
            let b = d.upload(&rand_bf(n, 0.5, 5))?;
            let mut y = d.alloc::<bf16>(m * n)?;
            // the heuristic's first answer, then the algorithm tuning keeps (the towers' default)
            for (tuning, label) in [
                (GemmTuning::Heuristic, "heuristic"),
                (GemmTuning::Measured, "tuned"),
            ] {
                d.set_gemm_tuning(tuning);
                let t = d.time_ms(5, 30, || {
                    d.gemm(
                        GemmInputs::Bf16 { x: &x, w: &w },
                        Some(GemmBias::Bf16(&b)),
                        GemmOutput::Bf16(&mut y),
                        GemmShape::dense(m, n, k),
                        Epilogue::None,
                    )
                })?;
                rows.push(plain(
                    format!("gemm {name} +bias {label}"),
                    median(&t),
                    2.0 * (m * n * k) as f64 / median(&t) / 1e9,
                    "TFLOP/s",
                ));
            }
        }
    }

    // flash attention at the anchors' shapes (16 heads; q, k, v strided inside one fused qkv buffer)
    if only.is_empty() || only.contains("attn") {
        for &(hd, n, b) in &[
            (72usize, 2394usize, 1usize),
            (72, 2394, 8),
            (64, 5184, 1),
            (64, 12288, 1),
            (96, 2704, 1),
            (96, 2704, 8),
            (96, 1296, 6),
        ] {
            let heads = 16;
            let width = heads * hd;
            let tokens = n * b;
            let qkv = d.upload(&rand_bf(tokens * 3 * width, 1.0, 6))?;
            let cu: Vec<i32> = (0..=b).map(|i| (i * n) as i32).collect();
            let cud = d.upload(&cu)?;
            let mut o = d.alloc::<bf16>(tokens * width)?;
            let mut variants = vec![FlashVariant::M1, FlashVariant::M2];
            if d.has_kernel(gpu_core::Kernel::FlashAttnWsHd64C3Bf16) {
                variants.extend([FlashVariant::Ws2, FlashVariant::Ws3]);
            }
            for variant in variants {
                let args = AttnArgs {
                    q: (&qkv, Mat::strided(tokens, width, 3 * width, 0)),
                    k: (&qkv, Mat::strided(tokens, width, 3 * width, width)),
                    v: (&qkv, Mat::strided(tokens, width, 3 * width, 2 * width)),
                    heads,
                    head_dim: hd,
                    cu_seqlens: &cud,
                    cu_seqlens_host: &cu,
                    scale: (hd as f32).powf(-0.5),
                    variant: Some(variant),
                };
                let t = d.time_ms(3, 20, || {
                    d.flash_attn(&args, &mut o, Mat::dense(tokens, width))
                })?;
                let flops = 4.0 * (n * n * hd * heads * b) as f64;
                rows.push(plain(
                    format!("attn hd{hd} n{n} b{b} {variant:?}"),
                    median(&t),
                    flops / median(&t) / 1e9,
                    "TFLOP/s",
                ));
            }
        }
    }

    // memory-bound kernels at the towers' batch-8 shapes (every operand > the 60 MB L2 except the
    // weights): bytes = each input read once + each output written once, against the copy floor
    if only.is_empty() || only.contains("mem") {
        let copy = match copy_gbs {
            Some(c) => c,
            None => measure_copy(&d)?.1,
        };
        let mut mem = |name: String, t: &[f32], bytes: usize| {
            let gbs = bytes as f64 / median(t) / 1e6;
            rows.push(Row {
                case: name,
                ms: median(t),
                rate: gbs,
                unit: "GB/s",
                mem: Some((bytes as f64 / 1e6, 100.0 * gbs / copy)),
            });
        };
        // (tower, tokens at batch 8, hidden, heads, head dim, mlp width)
        for &(tower, n, h, heads, hd, mi) in &[
            ("gemma", 2394 * 8, 1152usize, 16usize, 72usize, 4304usize),
            ("glm", 5184 * 8, 1024, 16, 64, 4096),
            ("step", 2704 * 8, 1536, 16, 96, 8960),
        ] {
            let m = Mat::dense(n, h);
            let x = d.upload(&rand_f32(n * h, 1.0, 7))?;
            let y = d.upload(&rand_f32(n * h, 1.0, 8))?;
            let w = d.upload(&rand_f32(h, 1.0, 9))?;
            let mut o = d.alloc::<bf16>(n * h)?;
            if tower == "step" {
                let t = d.time_ms(5, 30, || {
                    d.layer_norm(&x, m, Some(&w), Some(&w), &mut o, m, 1e-5)
                })?;
                mem(
                    format!("{tower} layer_norm f32->bf16 {n}x{h}"),
                    &t,
                    n * h * 6,
                );
                let t = d.time_ms(5, 30, || {
                    d.rms_norm(&x, m, Some(&w), &mut o, m, 1e-6, Clamp::NONE)
                })?;
                mem(
                    format!("{tower} rms_norm f32->bf16 {n}x{h} (v0.1 shape)"),
                    &t,
                    n * h * 6,
                );
            } else {
                let t = d.time_ms(5, 30, || {
                    d.rms_norm(&x, m, Some(&w), &mut o, m, 1e-6, Clamp::NONE)
                })?;
                mem(format!("{tower} rms_norm f32->bf16 {n}x{h}"), &t, n * h * 6);
            }
            let mut xr = d.upload(&rand_f32(n * h, 1.0, 10))?;
            if tower == "gemma" {
                let t = d.time_ms(5, 30, || {
                    d.residual_rms_add(
                        &mut xr,
                        &y,
                        m,
                        Some(&w),
                        1e-6,
                        Clamp::NONE,
                        Some((Some(&w), &mut o, 1e-6)),
                    )
                })?;
                mem(
                    format!("{tower} residual_rms_add + next norm {n}x{h}"),
                    &t,
                    n * h * 14,
                );
            } else {
                let scale = (tower == "step").then_some(&w);
                let t = d.time_ms(5, 30, || d.residual_add(&mut xr, &y, m, scale, Clamp::NONE))?;
                let what = if tower == "step" {
                    "residual_add layerscale"
                } else {
                    "residual_add"
                };
                mem(format!("{tower} {what} {n}x{h}"), &t, n * h * 12);
            }
            drop((x, y, o, xr));
            // MLP activation: gemma gelu_tanh and glm clamped SwiGLU on the fused gate|up GEMM output,
            // step quick_gelu (not gated) out of place
            if tower == "step" {
                let a = d.upload(&rand_bf(n * mi, 2.0, 11))?;
                let mut out = d.alloc::<bf16>(n * mi)?;
                let mm = Mat::dense(n, mi);
                let t = d.time_ms(5, 30, || {
                    d.act(
                        &mut out,
                        mm,
                        &a,
                        mm,
                        Activation::QuickGelu,
                        Clamp::NONE,
                        Clamp::NONE,
                    )
                })?;
                mem(
                    format!("{tower} act quick_gelu bf16 {n}x{mi}"),
                    &t,
                    n * mi * 4,
                );
            } else {
                let gu = d.upload(&rand_bf(n * 2 * mi, 2.0, 11))?;
                let mut out = d.alloc::<bf16>(n * mi)?;
                let gate = if tower == "gemma" {
                    Gate::plain(Activation::GeluTanh)
                } else {
                    Gate::swiglu_clamped(7.0)
                };
                let t = d.time_ms(5, 30, || {
                    d.gated_act(
                        &mut out,
                        Mat::dense(n, mi),
                        &gu,
                        Mat::strided(n, mi, 2 * mi, 0),
                        &gu,
                        Mat::strided(n, mi, 2 * mi, mi),
                        gate,
                    )
                })?;
                mem(
                    format!("{tower} gated_act {:?} bf16 {n}x{mi}", gate.act),
                    &t,
                    n * mi * 6,
                );
            }
            // per-head norm + rope in place on the fused qkv output (parts without work untouched)
            let width = heads * hd;
            let mut qkv = d.upload(&rand_bf(n * 3 * width, 1.0, 12))?;
            let gw = match tower {
                "gemma" => 57,
                "glm" => 72,
                _ => 52,
            };
            let pos: Vec<i32> = (0..n)
                .flat_map(|i| [(i % gw) as i32, ((i / gw) % gw) as i32])
                .collect();
            let posd = d.upload(&pos)?;
            let theta = if tower == "gemma" { 100.0 } else { 10000.0 };
            let inv = d.upload(&rope_inv_freq(hd, theta))?;
            let qw = d.upload(&rand_f32(hd, 1.0, 13))?;
            let (norm, layout, parts) = match tower {
                "gemma" => ([true; 3], RopeLayout::Gemma4, 3),
                "glm" => ([true, true, false], RopeLayout::Glm, 2),
                _ => ([false; 3], RopeLayout::Step3p7Vendor, 2),
            };
            let spec = QkvSpec {
                tokens: n,
                heads,
                head_dim: hd,
                ld: 3 * width,
                offsets: [0, width, 2 * width],
                q_weight: Some(&qw),
                k_weight: Some(&qw),
                norm,
                eps: 1e-6,
                clamps: [Clamp::NONE; 3],
            };
            let rope = RopeSpec {
                layout,
                pos: &posd,
                inv_freq: &inv,
            };
            let t = d.time_ms(5, 30, || d.qk_norm_rope(&mut qkv, &spec, Some(&rope)))?;
            mem(
                format!("{tower} qk_norm_rope {layout:?} hd{hd} {n} tok x {heads} heads x {parts} parts"),
                &t,
                n * parts * width * 2 * 2,
            );
        }
    }

    println!(
        "\n| case | median ms | rate | unit | MB moved | % of copy |\n|---|---|---|---|---|---|"
    );
    for r in rows {
        let (mb, pct) = match r.mem {
            Some((mb, pct)) => (format!("{mb:.1}"), format!("{pct:.0}%")),
            None => (String::new(), String::new()),
        };
        println!(
            "| {} | {:.4} | {:.1} | {} | {mb} | {pct} |",
            r.case, r.ms, r.rate, r.unit
        );
    }
    Ok(())
}

/// Runs the kernel bench (no arguments; `BENCH_ONLY=attn,gemm,mem,floor` narrows it).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    if let Some(a) = args.first() {
        anyhow::bail!("kernel-bench takes no arguments (got `{a}`; BENCH_ONLY narrows it)");
    }
    main_with().map_err(anyhow::Error::from)
}
