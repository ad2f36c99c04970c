//! `cargo xtask api-bench`: the Rust API's end-to-end time per call (bytes in, rows on the device
//! and ready), the figure the Python binding's overhead is measured against (docs/PERF.md).
//!
//! usage: cargo xtask api-bench --model DIR --image FILE [--batch 1,8] [--iters 30] [--warmup 5]
//!        [--dtype bf16|f32] [--json OUT]
//!
//! Each timed call is `Model::encode_device` of `batch` copies of the image's bytes followed by
//! `DeviceRows::synchronize` (wall clock, the same boundary a Python caller sees once it
//! synchronizes its stream); the median and the minimum of `iters` calls after `warmup` are
//! printed, one JSON object per batch size, with the time until `encode_device` returned (the
//! work queued, not done), the host half alone (`Preprocessor::prepare` of the batch, parallel as
//! in the encode) to split the time, and how the forwards ran (graphs replayed or eager).
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::time::Instant;

use rayon::prelude::*;

use vision_towers::vision_prep::{ImageSource, PrepSettings};
use vision_towers::{Device, Model, RowsDtype, TowerOptions};

struct Args {
    model: PathBuf,
    image: PathBuf,
    batches: Vec<usize>,
    iters: usize,
    warmup: usize,
    dtype: RowsDtype,
    json: Option<PathBuf>,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args {
        model: PathBuf::new(),
        image: PathBuf::new(),
        batches: vec![1, 8],
        iters: 30,
        warmup: 5,
        dtype: RowsDtype::Bf16,
        json: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => a.model = PathBuf::from(value()?),
            "--image" => a.image = PathBuf::from(value()?),
            "--batch" => {
                a.batches = value()?
                    .split(',')
                    .map(|b| b.parse::<usize>().context("--batch takes numbers"))
                    .collect::<Result<_>>()?
            }
            "--iters" => a.iters = value()?.parse()?,
            "--warmup" => a.warmup = value()?.parse()?,
            "--dtype" => {
                a.dtype = match value()?.as_str() {
                    "bf16" | "bfloat16" => RowsDtype::Bf16,
                    "f32" | "float32" => RowsDtype::F32,
                    other => bail!("--dtype {other}: bf16 or f32"),
                }
            }
            "--json" => a.json = Some(PathBuf::from(value()?)),
            other => bail!("unknown argument {other}"),
        }
    }
    if a.model.as_os_str().is_empty() || a.image.as_os_str().is_empty() || a.iters == 0 {
        bail!("usage: cargo xtask api-bench --model DIR --image FILE [--batch 1,8] [--iters N]");
    }
    Ok(a)
}

/// Entry point of `cargo xtask api-bench`.
pub fn run(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    let options = TowerOptions {
        device: Device::Cuda(0),
        ..TowerOptions::default()
    };
    let model = Model::open_with(&a.model, &options, PrepSettings::default())
        .with_context(|| format!("opening {}", a.model.display()))?;
    let bytes =
        std::fs::read(&a.image).with_context(|| format!("reading {}", a.image.display()))?;
    let mut lines = Vec::new();
    for &b in &a.batches {
        let sources = vec![ImageSource::Bytes(&bytes); b];
        // Each request's rows dropped right after its sync, or held until the next request's are
        // ready (as a consumer that keeps them for a while does).
        // (end to end, until `encode_device` returned) per call, each sorted
        let timed = |hold: bool| -> Result<(Vec<f64>, Vec<f64>)> {
            let mut times = Vec::with_capacity(a.iters);
            let mut returned = Vec::with_capacity(a.iters);
            let mut held = None;
            for i in 0..a.warmup + a.iters {
                let t = Instant::now();
                let out = model.encode_device(&sources, a.dtype)?;
                let back = t.elapsed().as_secs_f64() * 1e3;
                out.rows.synchronize()?;
                let ms = t.elapsed().as_secs_f64() * 1e3;
                if i >= a.warmup {
                    times.push(ms);
                    returned.push(back);
                }
                if hold {
                    held = Some(out);
                }
            }
            drop(held);
            times.sort_by(f64::total_cmp);
            returned.sort_by(f64::total_cmp);
            Ok((times, returned))
        };
        let (times, returned) = timed(false)?;
        let (held, _) = timed(true)?;
        // The host half alone (admission, decode, resize, patchify; parallel over the images as
        // in `encode_device`), to split the end-to-end time.
        let pre = model.preprocessor();
        let mut prep = Vec::with_capacity(a.iters);
        for _ in 0..a.iters {
            let t = Instant::now();
            let done: Vec<_> = sources
                .par_iter()
                .map(|s| pre.prepare(*s))
                .collect::<Result<_, _>>()?;
            prep.push(t.elapsed().as_secs_f64() * 1e3);
            for p in done {
                pre.recycle(p);
            }
        }
        prep.sort_by(f64::total_cmp);
        let line = serde_json::json!({
            "family": model.family().name(),
            "batch": b,
            "dtype": a.dtype.name(),
            "iters": a.iters,
            "median_ms": times[times.len() / 2],
            "min_ms": times[0],
            "returned_median_ms": returned[returned.len() / 2],
            "held_median_ms": held[held.len() / 2],
            "held_min_ms": held[0],
            "prep_median_ms": prep[prep.len() / 2],
            "prep_min_ms": prep[0],
            "rows_per_image": model.plan(ImageSource::Bytes(&bytes))?.rows,
            // whether the forwards were replayed graphs or eager launches (a failed capture
            // turns graphs off for good, and costs the launch overhead of every kernel)
            "graphs": format!("{:?}", model.tower().graph_status()),
            "graph_stats": format!("{:?}", model.tower().graph_stats()),
        });
        println!("{line}");
        lines.push(line);
    }
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&lines)?)?;
    }
    Ok(())
}
