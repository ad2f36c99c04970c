//! `gpu-core-bench`: kernel timings on the GPU machine (CUDA events, warm-up, median).
//! Prints one table; every row: case, median ms, achieved rate, and the rate's unit.
use gpu_core::*;

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

fn main() -> Result<()> {
    let d = Device::new(0)?;
    println!(
        "device: {} (sm {:?}, {} SMs)",
        d.name()?,
        d.compute_capability()?,
        d.multiprocessors()?
    );
    let mut rows: Vec<(String, f64, f64, &str)> = Vec::new();
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();

    // floors: D2D copy bandwidth and bf16 GEMM peak
    if only.is_empty() || only.contains("floor") {
        let n = 1usize << 30; // 1 Gi f32 = 4 GiB
        let a = d.alloc::<f32>(n)?;
        let mut b = d.alloc::<f32>(n)?;
        let t = d.time_ms(2, 10, || d.copy(&a, &mut b))?;
        rows.push((
            "floor: D2D copy 4 GiB".into(),
            median(&t),
            2.0 * 4.0 * n as f64 / median(&t) / 1e6,
            "GB/s",
        ));
        drop((a, b));
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
        rows.push((
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
            let t = d.time_ms(5, 30, || {
                d.gemm(
                    GemmInputs::Bf16 { x: &x, w: &w },
                    Some(GemmBias::Bf16(&b)),
                    GemmOutput::Bf16(&mut y),
                    GemmShape::dense(m, n, k),
                    Epilogue::None,
                )
            })?;
            rows.push((
                format!("gemm {name} +bias"),
                median(&t),
                2.0 * (m * n * k) as f64 / median(&t) / 1e9,
                "TFLOP/s",
            ));
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
            for variant in [FlashVariant::M1, FlashVariant::M2] {
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
                rows.push((
                    format!("attn hd{hd} n{n} b{b} {variant:?}"),
                    median(&t),
                    flops / median(&t) / 1e9,
                    "TFLOP/s",
                ));
            }
        }
    }

    // memory-bound kernels: bytes read + written over time
    if only.is_empty() || only.contains("mem") {
        let (r, h) = (2704 * 8, 1536);
        let x = d.upload(
            &rand_bf(r * h, 1.0, 7)
                .iter()
                .map(|v| v.to_f32())
                .collect::<Vec<_>>(),
        )?;
        let w = d.upload(&vec![1.0f32; h])?;
        let mut y = d.alloc::<bf16>(r * h)?;
        let t = d.time_ms(5, 30, || {
            d.rms_norm(
                &x,
                Mat::dense(r, h),
                Some(&w),
                &mut y,
                Mat::dense(r, h),
                1e-6,
                Clamp::NONE,
            )
        })?;
        rows.push((
            format!("rms_norm f32->bf16 {r}x{h}"),
            median(&t),
            (r * h * 6) as f64 / median(&t) / 1e6,
            "GB/s",
        ));
        let t = d.time_ms(5, 30, || {
            d.layer_norm(
                &x,
                Mat::dense(r, h),
                Some(&w),
                Some(&w),
                &mut y,
                Mat::dense(r, h),
                1e-5,
            )
        })?;
        rows.push((
            format!("layer_norm f32->bf16 {r}x{h}"),
            median(&t),
            (r * h * 6) as f64 / median(&t) / 1e6,
            "GB/s",
        ));
        let mut xr = d.upload(&vec![0.5f32; r * h])?;
        let t = d.time_ms(5, 30, || {
            d.residual_add(&mut xr, &x, Mat::dense(r, h), Some(&w), Clamp::NONE)
        })?;
        rows.push((
            format!("residual_add layerscale {r}x{h}"),
            median(&t),
            (r * h * 12) as f64 / median(&t) / 1e6,
            "GB/s",
        ));
        let (ri, ci) = (2704 * 8, 4304);
        let gu = d.upload(&rand_bf(ri * 2 * ci, 2.0, 8))?;
        let mut out = d.alloc::<bf16>(ri * ci)?;
        let t = d.time_ms(5, 30, || {
            d.gated_act(
                &mut out,
                Mat::dense(ri, ci),
                &gu,
                Mat::strided(ri, ci, 2 * ci, 0),
                &gu,
                Mat::strided(ri, ci, 2 * ci, ci),
                Gate::plain(Activation::GeluTanh),
            )
        })?;
        rows.push((
            format!("gated_act gelu_tanh {ri}x{ci}"),
            median(&t),
            (ri * ci * 6) as f64 / median(&t) / 1e6,
            "GB/s",
        ));
        let (n, heads, hd) = (2394 * 8, 16, 72);
        let width = heads * hd;
        let mut qkv = d.upload(&rand_bf(n * 3 * width, 1.0, 9))?;
        let pos: Vec<i32> = (0..n)
            .flat_map(|i| [(i % 57) as i32, ((i / 57) % 42) as i32])
            .collect();
        let posd = d.upload(&pos)?;
        let inv = d.upload(&rope_inv_freq(hd, 100.0))?;
        let qw = d.upload(&vec![1.0f32; hd])?;
        let spec = QkvSpec {
            tokens: n,
            heads,
            head_dim: hd,
            ld: 3 * width,
            offsets: [0, width, 2 * width],
            q_weight: Some(&qw),
            k_weight: Some(&qw),
            norm: [true; 3],
            eps: 1e-6,
            clamps: [Clamp::NONE; 3],
        };
        let rope = RopeSpec {
            layout: RopeLayout::Gemma4,
            pos: &posd,
            inv_freq: &inv,
        };
        let t = d.time_ms(5, 30, || d.qk_norm_rope(&mut qkv, &spec, Some(&rope)))?;
        rows.push((
            format!("qk_norm_rope gemma4 n{n} hd72"),
            median(&t),
            (n * 3 * width * 4) as f64 / median(&t) / 1e6,
            "GB/s",
        ));
    }

    println!("\n| case | median ms | rate | unit |\n|---|---|---|---|");
    for (c, ms, rate, unit) in rows {
        println!("| {c} | {ms:.4} | {rate:.1} | {unit} |");
    }
    Ok(())
}
