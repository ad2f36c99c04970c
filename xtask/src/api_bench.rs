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
//!
//! Then the breakdown of one request per batch size (issue 43), each stage timed alone, median
//! of `iters`: admission (`Preprocessor::plan`), decode (`Preprocessor::decode`: a large baseline
//! JPEG in row bands), prep (the rest of `Preprocessor::prepare`: resize, normalise, patchify),
//! and, on a second copy of the family's CUDA tower opened from the same directory, to bf16 (the
//! tower's `prepare_host`: layout and conversion), upload (plain, synchronised), tower (the
//! forward and projection, synchronised) and rows back (the rows downloaded to the host, which
//! `encode_device` does not do: its rows stay on the device). A table of the breakdown prints last.
use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use gpu_core::DeviceTower;

use rayon::prelude::*;

use vision_towers::vision_prep::{ImageSource, PrepSettings, Prepared};
use vision_towers::TowerOptions;
use vision_towers::{Device, Family, Model, RowsDtype};

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
    let mut table = Vec::new();
    let mut inline = Vec::new();
    for &b in &a.batches {
        let sources = vec![ImageSource::Bytes(&bytes); b];
        // Each request's rows dropped right after its sync, or held until the next request's are
        // ready (as a consumer that keeps them for a while does).
        // (end to end, until `encode_device` returned) per call, each sorted
        // Also each call's own stages (`DeviceEncoded::timings` and the wait), per call.
        let timed = |hold: bool| -> Result<(Vec<f64>, Vec<f64>, Vec<CallStages>)> {
            let mut times = Vec::with_capacity(a.iters);
            let mut returned = Vec::with_capacity(a.iters);
            let mut stages = Vec::with_capacity(a.iters);
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
                    let w = &out.timings;
                    let f = |d: std::time::Duration| d.as_secs_f64() * 1e3;
                    stages.push([
                        ms,
                        f(w.prepare),
                        f(w.host_layout),
                        f(w.device_setup),
                        f(w.upload),
                        f(w.launch),
                        ms - f(w.total()),
                    ]);
                }
                if hold {
                    held = Some(out);
                }
            }
            drop(held);
            times.sort_by(f64::total_cmp);
            returned.sort_by(f64::total_cmp);
            Ok((times, returned, stages))
        };
        let (times, returned, per_call) = timed(false)?;
        let (held, _, _) = timed(true)?;
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
        let parts = breakdown(&model, &sources, a.iters)?;
        table.push((b, times[times.len() / 2], parts));
        inline.push((b, per_call));
    }
    // The device stages on a tower opened again from the same directory (the model's own is not
    // reachable from here), after the model's is freed.
    let (pre, family) = (model.preprocessor().clone(), model.family());
    drop(model);
    let dev = Arc::new(gpu_core::Device::new(0)?);
    for (b, _, parts) in &mut table {
        let prepared: Vec<Prepared> = (0..*b)
            .map(|_| pre.prepare(ImageSource::Bytes(&bytes)))
            .collect::<Result<_, _>>()?;
        parts.device = Some(device_stages(&dev, family, &a.model, &prepared, a.iters)?);
    }
    for (b, e2e, parts) in &table {
        println!(
            "{}",
            serde_json::json!({"breakdown": true, "batch": b, "end_to_end_ms": e2e,
            "admission_ms": parts.admission, "decode_ms": parts.decode, "prep_ms": parts.prep,
            "device_ms": parts.device.map(|d| serde_json::json!({"to_bf16": d[0], "upload": d[1],
                "tower": d[2], "rows_back": d[3]}))})
        );
    }
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&lines)?)?;
    }
    println!(
        "\nthe same requests' own stages (`DeviceEncoded::timings`, then the wait on the rows), \
         ms: median of each column, and the calls at the end-to-end median and minimum"
    );
    println!("| batch | calls | end to end | prepare | host layout (to bf16) | device setup | upload queued | launch | wait for the device |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (b, calls) in &inline {
        let row = |what: &str, v: &CallStages| {
            println!(
                "| {b} | {what} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} |",
                v[0], v[1], v[2], v[3], v[4], v[5], v[6]
            )
        };
        let mut med: CallStages = [0.0; 7];
        for (k, m) in med.iter_mut().enumerate() {
            *m = median(calls.iter().map(|c| c[k]).collect());
        }
        row("median of each", &med);
        let mut by_total: Vec<&CallStages> = calls.iter().collect();
        by_total.sort_by(|x, y| x[0].total_cmp(&y[0]));
        if let (Some(mid), Some(first)) = (by_total.get(by_total.len() / 2), by_total.first()) {
            row("the median call", mid);
            row("the fastest call", first);
        }
    }
    println!(
        "\n{} ({}), each stage alone, median of {} calls, ms ({} rayon threads)",
        a.model.display(),
        a.image.display(),
        a.iters,
        rayon::current_num_threads()
    );
    println!("| batch | end to end (encode_device) | admission | decode | prep | to bf16 | upload | tower | rows back (to host) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (b, e2e, p) in &table {
        let d = |i: usize| p.device.map_or("—".into(), |d| format!("{:.2}", d[i]));
        println!(
            "| {b} | {e2e:.2} | {:.3} | {:.2} | {:.2} | {} | {} | {} | {} |",
            p.admission,
            p.decode,
            p.prep,
            d(0),
            d(1),
            d(2),
            d(3)
        );
    }
    Ok(())
}

/// One call's own stages, ms: end to end, then `RequestTimings`' five (prepare, host layout,
/// device setup, upload queued, launch), then the wait on the rows after the call returned.
type CallStages = [f64; 7];

/// One request's stages, ms (medians of separate runs of each).
struct Parts {
    admission: f64,
    decode: f64,
    prep: f64,
    /// to bf16, upload, tower, rows back.
    device: Option<[f64; 4]>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `f` `iters` times, ms each.
fn timed(iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    (0..iters)
        .map(|_| {
            let t = Instant::now();
            f()?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        })
        .collect()
}

/// The host stages of one request of `sources` (images in parallel, as `encode_device` does).
fn breakdown(model: &Model, sources: &[ImageSource<'_>], iters: usize) -> Result<Parts> {
    let pre = model.preprocessor();
    let admission = median(timed(iters, || {
        sources
            .par_iter()
            .try_for_each(|s| pre.plan(*s).map(drop))?;
        Ok(())
    })?);
    let decode = median(timed(iters, || {
        sources
            .par_iter()
            .try_for_each(|s| pre.decode(*s).map(drop))?;
        Ok(())
    })?);
    let prepare = median(timed(iters, || {
        let done: Vec<_> = sources
            .par_iter()
            .map(|s| pre.prepare(*s))
            .collect::<Result<_, _>>()?;
        done.into_iter().for_each(|p| pre.recycle(p));
        Ok(())
    })?);
    Ok(Parts {
        admission,
        decode,
        prep: (prepare - admission - decode).max(0.0),
        device: None,
    })
}

/// to bf16, upload, tower, rows back (ms, medians) of `prepared` on `family`'s CUDA tower opened
/// from `dir`.
fn device_stages(
    dev: &Arc<gpu_core::Device>,
    family: Family,
    dir: &Path,
    prepared: &[Prepared],
    iters: usize,
) -> Result<[f64; 4]> {
    use crate::bench_towers as bt;
    let missing = || anyhow!("a prepared image lacks its family's tensors");
    match family {
        Family::Gemma4 => {
            let images = prepared
                .iter()
                .map(|p| p.gemma4().ok_or_else(missing))
                .collect::<Result<Vec<_>>>()?;
            stages(
                &mut bt::gemma_cuda(dev, dir, tower_gemma::Precision::Bf16)?.tower,
                &images,
                iters,
            )
        }
        Family::Glm5Next | Family::GlmOcr => {
            let images = prepared
                .iter()
                .map(|p| p.glm().ok_or_else(missing))
                .collect::<Result<Vec<_>>>()?;
            stages(
                &mut bt::glm_cuda(dev, dir, tower_glm5::Precision::Bf16)?.tower,
                &images,
                iters,
            )
        }
        Family::Step3p7 => {
            let images = prepared
                .iter()
                .map(|p| p.step3p7().ok_or_else(missing))
                .collect::<Result<Vec<_>>>()?;
            stages(
                &mut bt::step_cuda(dev, dir, tower_step::Precision::Bf16)?.tower,
                &images,
                iters,
            )
        }
    }
}

/// The device half of one request on `t`, each stage synchronised before the next is timed.
fn stages<T: DeviceTower>(t: &mut T, images: &[T::Image<'_>], iters: usize) -> Result<[f64; 4]> {
    let e = |e: gpu_core::CudaError<T::Family>| anyhow!("{e}");
    let mut out = [(); 4].map(|_| Vec::with_capacity(iters));
    for i in 0..iters + 2 {
        let t0 = Instant::now();
        let host = T::prepare_host(t.config(), t.precision(), images).map_err(e)?;
        let t1 = Instant::now();
        let batch = host.upload_with(|inputs| t.device().upload_inputs(inputs))?;
        t.device().synchronize()?;
        let t2 = Instant::now();
        t.run(&batch, false).map_err(e)?;
        t.device().synchronize()?;
        let t3 = Instant::now();
        std::hint::black_box(t.rows(&batch).map_err(e)?);
        let t4 = Instant::now();
        // two warm-up calls: the first sees the layout eagerly, the second captures its graph
        if i >= 2 {
            for (k, (a, b)) in [(t0, t1), (t1, t2), (t2, t3), (t3, t4)]
                .into_iter()
                .enumerate()
            {
                out[k].push((b - a).as_secs_f64() * 1e3);
            }
        }
    }
    Ok(out.map(median))
}
