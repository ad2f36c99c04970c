//! `cargo xtask prep-breakdown`: where one image's host time goes, stage by stage, without a GPU
//! (issue 43: time to rows at batch 1).
//!
//! usage: cargo xtask prep-breakdown [--iters N] [--family F] [--save DIR]
//!
//! Two generated JPEGs (quality 90, the fixture photo `chelsea_660x300.jpg` upscaled): 1920×1080
//! and 1304×896 (step3p7's six crops). Each family's preprocessor is built from its fixture
//! model's processor config brought to the release's sizes (gemma4: 280 soft tokens; glm5_next:
//! the fixture's config is the release's; step3p7: 728 global view, 504 crops, 3024 cap, as
//! `xtask pipeline` writes it), and each stage is timed alone, the fastest of `--iters` wall-clock
//! runs on the rayon pool as the facade uses it (set `RAYON_NUM_THREADS` to compare):
//!
//! - admission: `Preprocessor::plan` (format sniff, header, budget, plan);
//! - decode: `Preprocessor::decode` (as `prepare` decodes: a large baseline JPEG in row bands);
//! - decode, 1 band: the same file with `PrepSettings::parallel` off (one decompressor, the
//!   decode before the bands), so a run shows what the bands gain on its cores;
//! - 1 band, 6 at once: that whole decode on 6 threads at the same time (the slowest of the six),
//!   the number of bands a 1080p decode is cut into: against "1 band", what running that many
//!   decompressors together costs each of them on this host (shared memory bandwidth, shared
//!   cores, a lower all-core clock), which the banded decode's critical path pays too;
//! - resize: `Preprocessor::resized_views` (the vendor resize to the views);
//! - norm+patch: `Preprocessor::prepare_rgb` (outputs handed back) less the resize;
//! - prepare: the whole `Preprocessor::prepare` (outputs handed back, as `Model::encode` does);
//! - to tower: the facade's view of the tensors and the CUDA tower's `prepare_host` in bf16 (the
//!   layout and bf16 conversion before the upload), with the family's config at release sizes.
//!
//! `--save DIR` writes the two JPEGs (`photo_1920x1080.jpg`, `photo_1304x896.jpg`) and, per
//! family, the release-size processor config (`DIR/<family>/preprocessor_config.json`), then
//! measures as usual: `xtask/bench/ttr_device.sh` feeds the same bytes to `api-bench`.
//! A table prints last.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Instant;

use gpu_core::{DeviceTower, Precision};
use tower_gemma::{GemmaConfig, GemmaCuda};
use tower_glm5::{GlmConfig, GlmCuda};
use tower_step::{StepConfig, StepCuda};
use vision_towers::vision_prep::{ImageSource, ModelConfigs, PrepSettings, Preprocessor};

/// Whole decodes run at once for the contention column: the bands `vision-prep` cuts a 1080p
/// baseline JPEG into on any pool of 6 threads or more (its 4-iMCU-row minimum drops the rest).
const CONCURRENT_DECODES: usize = 6;

/// The families measured, as their fixture model directories are named.
const FAMILIES: [&str; 3] = ["gemma4", "glm5_next", "step3p7"];

/// The images: (file name, width, height).
pub const IMAGES: [(&str, u32, u32); 2] = [
    ("photo_1920x1080.jpg", 1920, 1080),
    ("photo_1304x896.jpg", 1304, 896),
];

struct Args {
    iters: usize,
    family: Option<String>,
    save: Option<PathBuf>,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args {
        iters: 20,
        family: None,
        save: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--iters" => a.iters = value()?.parse().context("--iters takes a number")?,
            "--family" => a.family = Some(value()?.clone()),
            "--save" => a.save = Some(PathBuf::from(value()?)),
            other => bail!(
                "unknown argument {other}\nusage: cargo xtask prep-breakdown [--iters N] \
                 [--family F] [--save DIR]"
            ),
        }
    }
    if a.iters == 0 {
        bail!("--iters must be at least 1");
    }
    Ok(a)
}

/// A photo-like `w × h` JPEG (quality 90): the fixture photo upscaled (Catmull-Rom).
pub fn photo_jpeg(w: u32, h: u32) -> Result<Vec<u8>> {
    use image::codecs::jpeg::JpegEncoder;
    use image::{ExtendedColorType, ImageEncoder};
    let path = crate::fixtures::fixtures_dir()
        .join("images")
        .join("chelsea_660x300.jpg");
    let bytes = std::fs::read(&path).with_context(|| path.display().to_string())?;
    let src = image::load_from_memory(&bytes)?.to_rgb8();
    let img = image::imageops::resize(&src, w, h, image::imageops::FilterType::CatmullRom);
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut out, 90).write_image(
        img.as_raw(),
        w,
        h,
        ExtendedColorType::Rgb8,
    )?;
    Ok(out)
}

fn read_json(p: &Path) -> Result<Value> {
    serde_json::from_str(&std::fs::read_to_string(p).with_context(|| p.display().to_string())?)
        .with_context(|| p.display().to_string())
}

/// The fixture model's `config.json` and its processor config at the release's sizes.
pub fn release_configs(family: &str) -> Result<(Value, Value)> {
    let dir = crate::fixtures::fixtures_dir().join("models").join(family);
    let mut config = read_json(&dir.join("config.json"))?;
    let mut pre = read_json(&dir.join("preprocessor_config.json"))?;
    match family {
        "gemma4" => pre["max_soft_tokens"] = json!(280),
        "glm5_next" => {}
        "step3p7" => {
            pre["size"] = json!({"height": 728, "width": 728});
            pre["patch_size"] = json!(504);
            pre["max_image_size"] = json!(3024);
            config["vision_config"]["image_size"] = json!(728);
        }
        other => bail!("no release sizes for {other}"),
    }
    Ok((config, pre))
}

/// The fastest of `iters` wall-clock runs of `f`, ms (after one untimed run): on a machine
/// shared with other jobs the minimum is the figure they disturb least.
fn min_ms(iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut best = f64::INFINITY;
    for _ in 0..iters {
        let t0 = Instant::now();
        f()?;
        best = best.min(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(best)
}

/// One measured (family, image).
struct Row {
    family: &'static str,
    image: &'static str,
    rows: u64,
    admission: f64,
    decode: f64,
    decode_whole: f64,
    decode_together: f64,
    resize: f64,
    norm_patch: f64,
    prepare: f64,
    to_tower: Option<f64>,
}

/// The facade's tower inputs of `p` and the family's `prepare_host` in bf16, timed.
fn to_tower(
    family: &str,
    config: &Value,
    p: &vision_towers::vision_prep::Prepared,
    iters: usize,
) -> Result<f64> {
    let missing = || anyhow::anyhow!("the prepared image lacks the {family} tensors");
    match family {
        "gemma4" => {
            // The position table of the release (Gemma4VisionConfig.position_embedding_size).
            let cfg = GemmaConfig::from_hf(config, 10240, false)?;
            min_ms(iters, || {
                let img = p.gemma4().ok_or_else(missing)?;
                let host = GemmaCuda::prepare_host(&cfg, Precision::Bf16, &[img])
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                std::hint::black_box(host);
                Ok(())
            })
        }
        "glm5_next" => {
            let cfg = GlmConfig::from_hf(config)?;
            min_ms(iters, || {
                let img = p.glm().ok_or_else(missing)?;
                let host = GlmCuda::prepare_host(&cfg, Precision::Bf16, &[img])
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                std::hint::black_box(host);
                Ok(())
            })
        }
        "step3p7" => {
            let text = config["text_config"]["hidden_size"].as_u64().unwrap_or(0) as usize;
            let cfg = StepConfig::from_hf(config, text)?;
            min_ms(iters, || {
                let img = p.step3p7().ok_or_else(missing)?;
                let host = StepCuda::prepare_host(&cfg, Precision::Bf16, &[img])
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                std::hint::black_box(host);
                Ok(())
            })
        }
        other => bail!("no tower for {other}"),
    }
}

/// The preprocessors of one family: as the facade builds it, and with `parallel` off.
struct Pre {
    parallel: Preprocessor,
    serial: Preprocessor,
}

fn measure(
    family: &'static str,
    image: &'static str,
    bytes: &[u8],
    config: &Value,
    pres: &Pre,
    iters: usize,
) -> Result<Row> {
    let pre = &pres.parallel;
    let src = || ImageSource::Bytes(bytes);
    let admission = min_ms(iters, || {
        std::hint::black_box(pre.plan(src())?);
        Ok(())
    })?;
    let decode = min_ms(iters, || {
        std::hint::black_box(pre.decode(src())?);
        Ok(())
    })?;
    let decode_whole = min_ms(iters, || {
        std::hint::black_box(pres.serial.decode(src())?);
        Ok(())
    })?;
    let decode_together = min_ms(iters, || {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..CONCURRENT_DECODES)
                .map(|_| s.spawn(|| pres.serial.decode(src()).map(drop)))
                .collect();
            for h in handles {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a decode thread panicked"))??;
            }
            Ok(())
        })
    })?;
    let rgb = pre.decode(src())?;
    if pres.serial.decode(src())?.data != rgb.data {
        bail!("{family} {image}: the banded decode differs from the whole decode");
    }
    let resize = min_ms(iters, || {
        std::hint::black_box(pre.resized_views(&rgb)?);
        Ok(())
    })?;
    let from_rgb = min_ms(iters, || {
        pre.recycle(std::hint::black_box(pre.prepare_rgb(&rgb)?));
        Ok(())
    })?;
    let prepare = min_ms(iters, || {
        pre.recycle(std::hint::black_box(pre.prepare(src())?));
        Ok(())
    })?;
    let p = pre.prepare(src())?;
    let to_tower = match to_tower(family, config, &p, iters) {
        Ok(ms) => Some(ms),
        Err(e) => {
            eprintln!("{family} {image}: to tower not measured: {e:#}");
            None
        }
    };
    Ok(Row {
        family,
        image,
        rows: p.plan.rows,
        admission,
        decode,
        decode_whole,
        decode_together,
        resize,
        norm_patch: (from_rgb - resize).max(0.0),
        prepare,
        to_tower,
    })
}

/// Entry point of `cargo xtask prep-breakdown`.
pub fn run(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    let images: Vec<(&'static str, Vec<u8>)> = IMAGES
        .iter()
        .map(|&(name, w, h)| Ok((name, photo_jpeg(w, h)?)))
        .collect::<Result<_>>()?;
    if let Some(dir) = &a.save {
        std::fs::create_dir_all(dir)?;
        for (name, bytes) in &images {
            std::fs::write(dir.join(name), bytes)?;
        }
    }
    let threads = rayon::current_num_threads();
    let mut rows = Vec::new();
    for family in FAMILIES {
        if a.family.as_deref().is_some_and(|f| f != family) {
            continue;
        }
        let (config, pre_cfg) = release_configs(family)?;
        if let Some(dir) = &a.save {
            std::fs::create_dir_all(dir.join(family))?;
            std::fs::write(
                dir.join(family).join("preprocessor_config.json"),
                serde_json::to_string_pretty(&pre_cfg)?,
            )?;
        }
        let cfg = ModelConfigs {
            config: Some(config.clone()),
            preprocessor_config: Some(pre_cfg),
            ..Default::default()
        };
        let pre = Pre {
            parallel: Preprocessor::from_configs(&cfg, PrepSettings::default())?,
            serial: Preprocessor::from_configs(
                &cfg,
                PrepSettings {
                    parallel: false,
                    ..PrepSettings::default()
                },
            )?,
        };
        for (name, bytes) in &images {
            // step3p7's crops are the point of the 1304×896 image; the others take the 1080p one.
            if (family == "step3p7") != name.contains("1304") {
                continue;
            }
            let row = measure(family, name, bytes, &config, &pre, a.iters)?;
            println!(
                "{}",
                json!({
                    "family": row.family, "image": row.image, "threads": threads,
                    "rows": row.rows, "admission_ms": row.admission, "decode_ms": row.decode,
                    "decode_one_band_ms": row.decode_whole,
                    "decode_one_band_6_at_once_ms": row.decode_together,
                    "resize_ms": row.resize, "norm_patch_ms": row.norm_patch,
                    "prepare_ms": row.prepare, "to_tower_ms": row.to_tower,
                })
            );
            rows.push(row);
        }
    }
    let simd = match vision_towers::vision_prep::JPEG_SIMD {
        Some(true) => "with SIMD",
        Some(false) => "WITHOUT SIMD (about 2x slower)",
        None => "SIMD unknown",
    };
    println!(
        "\nprep breakdown, {threads} rayon thread(s), fastest of {} runs, ms; libjpeg-turbo {simd}",
        a.iters
    );
    println!("| family | image | rows | admission | decode | decode, 1 band | 1 band, {CONCURRENT_DECODES} at once | resize | norm+patch | prepare (all) | to tower (bf16) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let tt = r.to_tower.map_or("—".to_string(), |v| format!("{v:.2}"));
        println!(
            "| {} | {} | {} | {:.3} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {tt} |",
            r.family,
            r.image,
            r.rows,
            r.admission,
            r.decode,
            r.decode_whole,
            r.decode_together,
            r.resize,
            r.norm_patch,
            r.prepare
        );
    }
    Ok(())
}
