//! `vtower`: the command line of vision-towers.
//!
//! Every subcommand prints its answer on stdout and exits 0, or prints one line naming the file
//! and the problem on stderr and exits 1.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use vision_towers::vision_prep::video::VideoSettings;
use vision_towers::vision_prep::{
    ImageSource, PrepSettings, Prepared, TensorData, Video, VideoFrames, VideoMetadata,
};
use vision_towers::{
    inspect_json, preprocessor_for, read_image_arg, write_safetensors, Device, Model, OutTensor,
    Precision, Rows, Tower, TowerOptions, WeightFile, DEFAULT_MAX_PATCHES_PER_PASS,
};

/// Image bytes plus a model's weight file in, embedding rows out.
#[derive(Parser)]
#[command(name = "vtower", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print one JSON object describing a GGUF or safetensors weight file (file, model
    /// directory or sharded directory): format, family, tensors and metadata.
    Inspect {
        /// The weight file or model directory.
        path: PathBuf,
    },
    /// Print the plan for one image from its header alone (target size, grid, rows, prompt
    /// token runs) as one JSON object; no pixel is decoded.
    Plan {
        /// The model: a GGUF mmproj file, or a safetensors file or model directory.
        #[arg(long)]
        model: PathBuf,
        /// The image: a file path or a `data:` URI (network schemes are refused).
        image: String,
        #[command(flatten)]
        budget: Budget,
    },
    /// Run the model's image processor on one image and write its tensors under the upstream
    /// names and dtypes to a safetensors file.
    Prep {
        /// The model: a GGUF mmproj file, or a safetensors file or model directory.
        #[arg(long)]
        model: PathBuf,
        /// The image: a file path or a `data:` URI (network schemes are refused).
        image: String,
        /// Where to write the tensors.
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        budget: Budget,
    },
    /// Encode images into embedding rows in the LM's width and write them as
    /// `embeddings` F32 [rows, width] to a safetensors file.
    Encode {
        /// The model: a GGUF mmproj file, or a safetensors file or model directory.
        #[arg(long)]
        model: PathBuf,
        /// An image (a file path or a `data:` URI), prepared by the model's own processor;
        /// repeat the flag to encode several images in one pass.
        #[arg(
            long,
            conflicts_with_all = ["inputs", "video_frames"],
            required_unless_present_any = ["inputs", "video_frames"]
        )]
        image: Vec<String>,
        /// A video's frames, every frame of it in order: a directory (its files sorted by name)
        /// or the frame files (JPEG, PNG, WebP, GIF, BMP). The container (MP4, WebM) is decoded
        /// by the caller, e.g. `ffmpeg -i v.mp4 frames/%06d.png`. Needs `--fps`; the model's
        /// video processor samples and prepares them (glm5_next, gemma4; docs/VIDEO.md).
        #[arg(long, num_args = 1.., conflicts_with = "inputs", requires = "fps")]
        video_frames: Vec<PathBuf>,
        /// The video's frame rate (its metadata's fps), for `--video-frames`.
        #[arg(long, requires = "video_frames")]
        fps: Option<f64>,
        /// The video's duration in seconds, if the container states it (otherwise derived from
        /// the frame count and fps, as upstream does).
        #[arg(long, requires = "video_frames")]
        duration: Option<f64>,
        /// glm5_next: the target sampling rate in frames per second (default: the video
        /// processor config's, 2).
        #[arg(long, requires = "video_frames")]
        sample_fps: Option<f64>,
        /// gemma4: how many frames to sample, uniformly (default: the video processor config's,
        /// 32; a video with fewer frames is refused, as upstream).
        #[arg(long, requires = "video_frames")]
        num_frames: Option<u64>,
        /// The processor's tensors instead of an image (as `vtower prep` or the upstream
        /// processor writes them).
        #[arg(long)]
        inputs: Option<PathBuf>,
        /// Where to write the rows.
        #[arg(long)]
        out: PathBuf,
        /// Where the tower runs: auto (CUDA device 0 when one opens, else the CPU), cpu, cuda
        /// or cuda:N (an error when that device does not open).
        #[arg(long, default_value_t = Device::Auto)]
        device: Device,
        /// Arithmetic: f32 (the host reference; CUDA's exactness mode), bf16 (CUDA tensor
        /// cores, compute capability 8.0+) or f16 (CUDA tensor cores, every tier: Turing's).
        /// Default: f32 on the CPU, bf16 on CUDA (f16 on a 7.5 tier).
        #[arg(long)]
        precision: Option<Precision>,
        /// The most patches one pass of the tower holds: more images run in several passes,
        /// which bounds activation memory; one image over it is refused.
        #[arg(long, default_value_t = DEFAULT_MAX_PATCHES_PER_PASS)]
        max_patches_per_pass: usize,
        /// On CUDA, run an older GPU tier on this card (7.5, 8.0, 8.6, 8.7, 8.9, 9.0, 10.0, 12.0):
        /// its code, limits and kernels. A test of code paths, not of speed (docs/TIERS.md); the
        /// GPU_CORE_FORCE_TIER environment variable does the same.
        #[arg(long, value_parser = parse_gpu_tier)]
        gpu_tier: Option<(u32, u32)>,
    },
}

fn parse_gpu_tier(s: &str) -> Result<(u32, u32), String> {
    vision_towers::parse_tier(s).map_err(|e| e.to_string())
}

/// Where a tower ran, for the output's metadata and the last line.
struct RanOn {
    device: Device,
    precision: Precision,
    tier: Option<String>,
    cpu_reason: Option<String>,
}

impl RanOn {
    fn of(t: &Tower) -> RanOn {
        let r = RanOn {
            device: t.device(),
            precision: t.precision(),
            tier: t.tier().map(str::to_string),
            cpu_reason: t.cpu_reason().map(str::to_string),
        };
        // `auto` ran on the CPU although a device is present: one warning line, never silent
        if let Some(why) = &r.cpu_reason {
            eprintln!("vtower: warning: running on the CPU: {why}");
        }
        r
    }

    /// `device`, `precision` and, where known, `gpu_tier` / `cublaslt` / `cpu_reason` metadata
    /// entries.
    fn metadata(&self) -> Vec<(String, String)> {
        let mut m = vec![
            ("device".to_string(), self.device.to_string()),
            ("precision".to_string(), self.precision.to_string()),
        ];
        if let Some(t) = &self.tier {
            m.push(("gpu_tier".to_string(), t.clone()));
            // which cuBLASLt the GEMMs ran on, and how it was found (gpu-core's lt_lib)
            if let Ok(lt) = vision_towers::gpu_core::cublaslt() {
                let v = lt.version;
                m.push((
                    "cublaslt".to_string(),
                    format!(
                        "{} ({}, {}.{}.{})",
                        lt.path.display(),
                        lt.source.name(),
                        v / 10_000,
                        v / 100 % 100,
                        v % 100
                    ),
                ));
            }
        }
        if let Some(r) = &self.cpu_reason {
            m.push(("cpu_reason".to_string(), r.clone()));
        }
        m
    }
}

/// Budgets that override the model's processor config.
#[derive(clap::Args, Clone, Copy)]
struct Budget {
    /// gemma4 soft-token budget per image: 70, 140, 280, 560 or 1120.
    #[arg(long)]
    max_soft_tokens: Option<u32>,
    /// glm5_next upper token budget per image.
    #[arg(long)]
    max_image_tokens: Option<u64>,
    /// Refuse images over this many megapixels before decoding.
    #[arg(long, default_value_t = 50)]
    max_megapixels: u64,
}

impl Budget {
    fn settings(self) -> PrepSettings {
        let mut s = PrepSettings {
            max_soft_tokens: self.max_soft_tokens,
            max_image_tokens: self.max_image_tokens,
            ..Default::default()
        };
        s.limits.max_pixels = self.max_megapixels.saturating_mul(1_000_000);
        s
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("vtower: {}", one_line(&err));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Inspect { path } => {
            let file = WeightFile::open(&path)?;
            print_json(&inspect_json(&file))
        }
        Command::Plan {
            model,
            image,
            budget,
        } => {
            let file = WeightFile::open(&model)?;
            let pre = preprocessor_for(&model, &file, budget.settings())?;
            let img = read_image_arg(&image)?;
            let plan = pre
                .plan(img.source())
                .with_context(|| img.label().display().to_string())?;
            print_json(&plan.to_json())
        }
        Command::Prep {
            model,
            image,
            out,
            budget,
        } => {
            let file = WeightFile::open(&model)?;
            let pre = preprocessor_for(&model, &file, budget.settings())?;
            let img = read_image_arg(&image)?;
            let prepared = pre
                .prepare(img.source())
                .with_context(|| img.label().display().to_string())?;
            let meta = [("plan".to_string(), prepared.plan.to_json().to_string())];
            write_safetensors(&out, &out_tensors(&prepared), &meta)?;
            Ok(())
        }
        Command::Encode {
            model,
            image,
            video_frames,
            fps,
            duration,
            sample_fps,
            num_frames,
            inputs,
            out,
            device,
            precision,
            max_patches_per_pass,
            gpu_tier,
        } => {
            let options = TowerOptions {
                device,
                precision,
                max_patches_per_pass,
                // one encode is one pass per layout: a graph would be captured and never replayed
                graphs: false,
                force_tier: gpu_tier,
            };
            if !video_frames.is_empty() {
                let m = Model::open_with(&model, &options, PrepSettings::default())?;
                let settings = VideoSettings {
                    fps: sample_fps,
                    num_frames,
                    ..Default::default()
                };
                let pre = m.video_preprocessor(settings)?;
                let limits = pre.settings().limits;
                let files = frame_files(&video_frames, limits.max_frames)?;
                let metadata = VideoMetadata {
                    total_num_frames: files.len() as u64,
                    fps,
                    duration,
                };
                // Only the sampled frames are read; the others stay empty and are never looked at.
                let sampled = pre.sampled_indices(&metadata)?;
                let mut bytes = vec![Vec::new(); files.len()];
                let mut total = 0u64;
                for &i in &sampled {
                    let i = i as usize;
                    if bytes[i].is_empty() {
                        bytes[i] = read_frame(&files[i], limits.max_bytes.saturating_sub(total))?;
                        total += bytes[i].len() as u64;
                    }
                }
                let sources: Vec<ImageSource<'_>> =
                    bytes.iter().map(|b| ImageSource::Bytes(b)).collect();
                let video = Video {
                    frames: VideoFrames::Encoded(&sources),
                    metadata,
                };
                let ran_on = RanOn::of(m.tower());
                let encoded = m.encode_video_with(&pre, &video)?;
                let n = encoded.rows.len() / encoded.width.max(1);
                let mut meta = vec![("family".to_string(), m.family().name().to_string())];
                meta.extend(ran_on.metadata());
                meta.push(("video_plan".to_string(), encoded.plan.to_json().to_string()));
                write_safetensors(
                    &out,
                    &[OutTensor::f32(
                        "embeddings",
                        vec![n, encoded.width],
                        &encoded.rows,
                    )],
                    &meta,
                )?;
                eprintln!(
                    "vtower: wrote {n} rows × {} for {} of {} frames (grid {:?}) to {} ({} {})",
                    encoded.width,
                    encoded.plan.frames_indices.len(),
                    sources.len(),
                    encoded.plan.grid_thw,
                    out.display(),
                    m.device(),
                    m.precision()
                );
                return Ok(());
            }
            let (family, ran_on, rows) = match inputs {
                Some(inputs) => {
                    let tower = Tower::open_with(&model, &options)?;
                    let ran_on = RanOn::of(&tower);
                    (tower.family(), ran_on, tower.encode_prepared_file(&inputs)?)
                }
                None => {
                    let m = Model::open_with(&model, &options, PrepSettings::default())?;
                    let ran_on = RanOn::of(m.tower());
                    let read = image
                        .iter()
                        .map(|i| read_image_arg(i))
                        .collect::<Result<Vec<_>, _>>()?;
                    let sources: Vec<_> = read.iter().map(|r| r.source()).collect();
                    let encoded = m.encode(&sources)?;
                    let width = encoded.first().map_or(0, |e| e.width);
                    (
                        m.family(),
                        ran_on,
                        Rows {
                            width,
                            per_image: encoded.into_iter().map(|e| e.rows).collect(),
                        },
                    )
                }
            };
            let all: Vec<f32> = rows.per_image.concat();
            let n = all.len() / rows.width.max(1);
            let mut meta = vec![("family".to_string(), family.name().to_string())];
            meta.extend(ran_on.metadata());
            meta.push((
                "rows_per_image".to_string(),
                serde_json::to_string(
                    &rows
                        .per_image
                        .iter()
                        .map(|r| r.len() / rows.width.max(1))
                        .collect::<Vec<_>>(),
                )?,
            ));
            write_safetensors(
                &out,
                &[OutTensor::f32("embeddings", vec![n, rows.width], &all)],
                &meta,
            )?;
            eprintln!(
                "vtower: wrote {n} rows × {} to {} ({} {})",
                rows.width,
                out.display(),
                ran_on.device,
                ran_on.precision
            );
            Ok(())
        }
    }
}

/// The frame files of `--video-frames`: one directory's files sorted by name (hidden files
/// skipped), or the files as given; more than `max_frames` is refused before any is read.
fn frame_files(args: &[PathBuf], max_frames: u64) -> Result<Vec<PathBuf>> {
    let files = match args {
        [dir] if dir.is_dir() => {
            let mut v = Vec::new();
            for e in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
                let e = e.with_context(|| dir.display().to_string())?;
                let hidden = e.file_name().to_string_lossy().starts_with('.');
                if !hidden && e.file_type().is_ok_and(|t| t.is_file()) {
                    v.push(e.path());
                }
                if v.len() as u64 > max_frames {
                    anyhow::bail!(
                        "{}: more than {max_frames} frames (the video frame budget)",
                        dir.display()
                    );
                }
            }
            v.sort();
            v
        }
        files => files.to_vec(),
    };
    if files.is_empty() {
        anyhow::bail!("--video-frames: no frame files");
    }
    if files.len() as u64 > max_frames {
        anyhow::bail!(
            "--video-frames: {} frames, over the video frame budget of {max_frames}",
            files.len()
        );
    }
    Ok(files)
}

/// One frame file's bytes (refused before it is read when it would take the frames read so far
/// over the video byte budget: `max_bytes` is what is left of it).
fn read_frame(path: &std::path::Path, max_bytes: u64) -> Result<Vec<u8>> {
    let len = std::fs::metadata(path)
        .with_context(|| path.display().to_string())?
        .len();
    if len > max_bytes {
        anyhow::bail!(
            "{}: {len} bytes, over what is left of the video byte budget ({max_bytes})",
            path.display()
        );
    }
    std::fs::read(path).with_context(|| path.display().to_string())
}

/// The prepared tensors as safetensors entries, under their upstream names and dtypes.
fn out_tensors(p: &Prepared) -> Vec<OutTensor> {
    p.tensors
        .iter()
        .map(|t| match &t.data {
            TensorData::F32(v) => OutTensor::f32(t.name, t.shape.clone(), v),
            TensorData::I64(v) => OutTensor::i64(t.name, t.shape.clone(), v),
            TensorData::U8(v) => OutTensor::u8(t.name, t.shape.clone(), v.clone()),
        })
        .collect()
}

fn print_json(value: &serde_json::Value) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    serde_json::to_writer(&mut out, value).context("writing to stdout")?;
    writeln!(out).context("writing to stdout")?;
    Ok(())
}

/// The error and its causes on one line, newlines flattened.
fn one_line(err: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in err.chain() {
        let text = cause.to_string().replace('\n', " ");
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}
