//! `cargo xtask step-check <repo> <case> [--host] [--iters N]`: loads a vendor-layout Step-3.7 checkpoint
//! directory and the case written by `xtask/bench/step_fullsize.py` (one image: 6 crop tiles +
//! the global view, upstream float32 rows), runs the CUDA tower in f32 and bf16 and prints rel-L2
//! against upstream, then times the bf16 tower with CUDA events (3 warm-ups, median of `N`,
//! default 10): one 728 view b1, 504 tiles b6, 728 views b8 and the 6 tiles + global image, with
//! TFLOP/s from the anchors' FLOP count and the PyTorch anchors beside; also the load time and the
//! resident weight MiB. `--host` runs the host reference instead of the device (a CPU check of
//! the checkpoint and case on a tiny oracle).
//!
//! `<case>/meta.json` = `{"side", "tile", "tiles", "rows": [n, text_hidden]}`; `pixels_global.f32`
//! `[1, 3, side, side]`, `pixels_local.f32` `[tiles, 3, tile, tile]`, `rows_f32.f32` (upstream
//! float32 rows, tiles first), `rows_bf16.f32` (optional, upstream bf16 rows for scale); all
//! little-endian f32. Exits 0 with "no device" on a machine without CUDA.
use std::error::Error;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use gpu_core::DeviceTower;
use tower_step::cuda::{Device, GpuError};
use tower_step::{Precision, StepConfig, StepCuda, StepImage, StepTower, StepView};
use vision_towers::tower_core::rel_l2;

type Res<T> = std::result::Result<T, Box<dyn Error>>;

/// Anchors from `/work/shared/anchors/README.md` (H200, transformers 5.23 bf16): SDPA ms,
/// torch.compile ms; and the goal in views per second.
const ANCHORS: [(&str, f64, f64, f64); 3] = [
    ("728 b1", 38.0, 26.2, 50.0),
    ("504 tiles b6", 92.4, 62.6, 115.0),
    ("728 b8", 271.3, 188.7, 50.0),
];

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

fn view(pixels: &[f32], side: usize) -> StepView<'_> {
    StepView {
        pixels,
        height: side,
        width: side,
    }
}

/// The anchors' FLOP count for `batch` square views of `side` pixels (torch_baseline.py `step`):
/// patch conv, per layer 4 H×H linears + the MLP + attention `4n²H`, the two convs, the projector.
fn flops(c: &StepConfig, side: usize, batch: usize) -> f64 {
    let g = (side / c.patch) as f64;
    let n = g * g;
    let (h, i, l) = (c.hidden as f64, c.intermediate as f64, c.layers as f64);
    let g1 = ((g as usize - 1) / 2 + 1) as f64;
    let g2 = ((g1 as usize - 1) / 2 + 1) as f64;
    batch as f64
        * (2.0 * n * c.patch_dim() as f64 * h
            + l * (2.0 * n * 4.0 * h * h + 2.0 * n * 2.0 * h * i + 4.0 * n * n * h)
            + 2.0 * g1 * g1 * 9.0 * h * 2.0 * h
            + 2.0 * g2 * g2 * 9.0 * 2.0 * h * 4.0 * h
            + 2.0 * g2 * g2 * 4.0 * h * c.text_hidden as f64)
}

fn rows_flat(t: &mut StepCuda, images: &[StepImage<'_>]) -> Res<Vec<f32>> {
    let (rows, _) = t.encode(images, false)?;
    Ok(rows.into_iter().flat_map(|r| r.rows).collect())
}

fn main_with(args: &[String]) -> Res<()> {
    let host = args.iter().any(|a| a == "--host");
    let iters: usize = match args.iter().position(|a| a == "--iters") {
        Some(i) => args.get(i + 1).ok_or("--iters needs a number")?.parse()?,
        None => 10,
    };
    let pos: Vec<&String> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| !a.starts_with("--") && (*i == 0 || args[i - 1] != "--iters"))
        .map(|(_, a)| a)
        .collect();
    let [repo, case] = pos[..] else {
        return Err(
            "usage: xtask step-check <checkpoint dir> <case dir> [--host] [--iters N]".into(),
        );
    };
    let case = Path::new(case);
    let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(case.join("meta.json"))?)?;
    let dim = |k: &str| -> Res<usize> {
        Ok(meta
            .get(k)
            .and_then(|v| v.as_u64())
            .ok_or_else(|| format!("meta.json: {k} missing"))? as usize)
    };
    let (side, tile, tiles) = (dim("side")?, dim("tile")?, dim("tiles")?);
    let global = read_f32(&case.join("pixels_global.f32"))?;
    let local = read_f32(&case.join("pixels_local.f32"))?;
    let up_f32 = read_f32(&case.join("rows_f32.f32"))?;
    let up_bf16 = read_f32(&case.join("rows_bf16.f32")).ok();
    let tl = 3 * tile * tile;
    if global.len() != 3 * side * side || local.len() != tiles * tl {
        return Err(format!(
            "pixels: {} global / {} local values for side {side}, {tiles} tiles of {tile}",
            global.len(),
            local.len()
        )
        .into());
    }
    let image = StepImage {
        crops: (0..tiles)
            .map(|i| view(&local[i * tl..(i + 1) * tl], tile))
            .collect(),
        global: view(&global, side),
        newline_mask: vec![false; tiles],
    };

    let t0 = Instant::now();
    let ck = st_reader::Checkpoint::open(Path::new(repo))?;
    let tower = StepTower::from_checkpoint(&ck)?;
    let host_load = t0.elapsed().as_secs_f64();
    let c = tower.config.clone();
    println!(
        "config: H {} × {} layers, {} heads × {}, I {}, patch {}, table {}², projector {} → {} (bias {}), weights {:?} layout; host load {host_load:.1} s",
        c.hidden, c.layers, c.heads, c.head_dim, c.intermediate, c.patch, c.pos_side,
        c.out_width(), c.text_hidden, c.projector_bias, tower.weights.layout
    );
    let mut summary: Vec<String> = Vec::new();
    let report = |label: &str, rows: &[f32]| -> String {
        let r = rel_l2(rows, &up_f32);
        let finite = rows.iter().all(|v| v.is_finite());
        let vs16 = up_bf16.as_ref().map_or(String::new(), |b| {
            format!(", vs upstream bf16 {:.3e}", rel_l2(rows, b))
        });
        println!("{label} rows vs upstream f32: rel-L2 {r:.3e} (finite: {finite}){vs16}");
        format!("| {label} rows vs upstream f32 | {r:.2e} |")
    };
    if let Some(b) = &up_bf16 {
        println!(
            "upstream bf16 vs upstream f32: rel-L2 {:.3e} (for scale)",
            rel_l2(b, &up_f32)
        );
    }
    if host {
        let t = Instant::now();
        let rows: Vec<f32> = tower
            .encode_host(std::slice::from_ref(&image))?
            .into_iter()
            .flat_map(|r| r.rows)
            .collect();
        println!("host reference: {:.1} s", t.elapsed().as_secs_f64());
        summary.push(report("host-f32", &rows));
        for s in &summary {
            println!("{s}");
        }
        return Ok(());
    }

    let t1 = Instant::now();
    let dev = match Device::new(0) {
        Ok(d) => Arc::new(d),
        Err(GpuError::NoDevice(why)) => {
            println!("no device: {why}");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let dev_open = t1.elapsed().as_secs_f64();
    println!(
        "device: {} ({} SMs), opened in {dev_open:.1} s",
        dev.name()?,
        dev.multiprocessors()?
    );

    // Exactness mode first (its f32 weights are freed before the bf16 upload).
    {
        let t = Instant::now();
        let mut f = tower.to_cuda(dev.clone(), Precision::F32)?;
        let up = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let rows = rows_flat(&mut f, std::slice::from_ref(&image))?;
        println!(
            "cuda-f32: upload {up:.1} s, {:.0} MiB, first run {:.2} s",
            f.weight_bytes() as f64 / (1 << 20) as f64,
            t.elapsed().as_secs_f64()
        );
        summary.push(report("cuda-f32", &rows));
    }

    let t2 = Instant::now();
    let mut cuda = tower.to_cuda(dev.clone(), Precision::Bf16)?;
    let upload = t2.elapsed().as_secs_f64();
    let mib = cuda.weight_bytes() as f64 / (1 << 20) as f64;
    println!(
        "cuda-bf16: load = host {host_load:.1} s + device open {dev_open:.1} s + bf16 upload {upload:.1} s; {mib:.0} MiB resident weights"
    );
    let rows = rows_flat(&mut cuda, std::slice::from_ref(&image))?;
    summary.push(report("cuda-bf16", &rows));
    summary.push(format!(
        "| load (host f32 / bf16 upload) | {host_load:.1} s / {upload:.1} s |"
    ));
    summary.push(format!("| resident bf16 weights | {mib:.0} MiB |"));

    // Timing cases: (label, views, view side, images as (crops, global)).
    let globals = |k: usize| -> Vec<StepImage<'_>> {
        (0..k)
            .map(|_| StepImage {
                crops: vec![],
                global: view(&global, side),
                newline_mask: vec![],
            })
            .collect()
    };
    let tiles_alone: Vec<StepImage<'_>> = (0..tiles)
        .map(|i| StepImage {
            crops: vec![],
            global: view(&local[i * tl..(i + 1) * tl], tile),
            newline_mask: vec![],
        })
        .collect();
    let cases: Vec<(&str, usize, f64, Vec<StepImage<'_>>)> = vec![
        ("728 b1", 1, flops(&c, side, 1), globals(1)),
        ("504 tiles b6", tiles, flops(&c, tile, tiles), tiles_alone),
        ("728 b8", 8, flops(&c, side, 8), globals(8)),
        (
            "6 tiles + 728 (one image)",
            tiles + 1,
            flops(&c, tile, tiles) + flops(&c, side, 1),
            vec![image.clone()],
        ),
    ];
    let mut b1: Option<Vec<f32>> = None;
    let mut table = Vec::new();
    for (label, views, fl, images) in &cases {
        let batch = cuda.prepare(images)?;
        cuda.run(&batch, false)?;
        let rows = cuda.rows(&batch)?;
        let finite = rows.iter().all(|r| r.rows.iter().all(|v| v.is_finite()));
        let note = match (*label, &b1) {
            ("728 b1", _) => {
                b1 = Some(rows[0].rows.clone());
                String::new()
            }
            ("728 b8", Some(r1)) => format!(
                ", image 0 of b8 vs b1 rel-L2 {:.2e}, image 7 {:.2e}",
                rel_l2(&rows[0].rows, r1),
                rel_l2(&rows[7].rows, r1)
            ),
            _ => String::new(),
        };
        let mut failed: Option<tower_step::CudaError> = None;
        let times = dev.time_ms(3, iters, || {
            if failed.is_none() {
                if let Err(e) = cuda.run(&batch, false) {
                    failed = Some(e);
                }
            }
            Ok(())
        })?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        let med = times[times.len() / 2] as f64;
        let tf = fl / (med * 1e-3) / 1e12;
        let vps = *views as f64 / (med * 1e-3);
        println!(
            "{label}: {} tokens, median {med:.2} ms (min {:.2}, max {:.2}), {vps:.1} views/s, {tf:.0} TFLOP/s ({:.2} TFLOP), rows finite: {finite}{note}",
            batch.tokens(),
            times[0],
            times[times.len() - 1],
            fl / 1e12
        );
        table.push((*label, *views, med, vps, tf));
    }
    println!("\n| case | ours ms | views/s | TFLOP/s | SDPA ms | torch.compile ms (views/s) | goal | vs compile |");
    println!("|---|---|---|---|---|---|---|---|");
    for (label, views, med, vps, tf) in table {
        match ANCHORS.iter().find(|a| a.0 == label) {
            Some(&(_, sdpa, comp, goal)) => println!(
                "| {label} | {med:.1} | {vps:.1} | {tf:.0} | {sdpa} | {comp} ({:.1}) | ≥ {goal} views/s | {:.2}× |",
                views as f64 / (comp * 1e-3),
                comp / med
            ),
            None => println!("| {label} | {med:.1} | {vps:.1} | {tf:.0} | – | – | ≤ 60 ms with prep | – |"),
        }
    }
    println!();
    for s in &summary {
        println!("{s}");
    }
    Ok(())
}

/// Runs the check with `args` (the subcommand's arguments, see the module docs).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    main_with(args).map_err(|e| anyhow::anyhow!("{e}"))
}
