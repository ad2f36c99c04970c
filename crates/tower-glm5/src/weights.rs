//! Loading the GLM vision weights (`model.visual.*`) from an HF checkpoint into host f32.
//!
//! Layouts are HF's: linear weights `[out, in]`; the Conv3d patch embedding `[H, C, T, p, p]`
//! is used as `[H, C·T·p²]` (columns (c, t, ky, kx), the processor's row order); the Conv2d
//! downsample `[O, H, 2, 2]` as `[O, 4H]` (columns (c, ky, kx)).

use crate::config::GlmConfig;
use crate::error::{GlmError, Result};
use gpu_core::{HostTensor, LeDtype, TensorStore};
use st_reader::{Checkpoint, StError, TensorView};
use std::collections::BTreeSet;

/// The canonical prefix of every vision tensor in a whole-model checkpoint.
pub const HF_PREFIX: &str = "model.visual.";
/// The tensor whose presence says the checkpoint has a vision tower at all.
pub const PROBE_TENSOR: &str = "model.visual.patch_embed.proj.weight";

/// A dense linear `y = W·x (+ b)`.
#[derive(Debug, Clone)]
pub struct Linear<T = Vec<f32>> {
    /// `[out, inp]`, row-major.
    pub w: T,
    /// `[out]`, when the layer has a bias.
    pub b: Option<T>,
    /// Output width.
    pub out: usize,
    /// Input width.
    pub inp: usize,
}

/// One vision block's weights.
#[derive(Debug, Clone)]
pub struct Block<T = Vec<f32>> {
    /// `norm1` RMSNorm weight `[H]` (before attention).
    pub norm1: T,
    /// `norm2` RMSNorm weight `[H]` (before the MLP).
    pub norm2: T,
    /// Fused `attn.qkv` `[3H, H]` (rows q | k | v, each head-contiguous).
    pub qkv: Linear<T>,
    /// `attn.proj` `[H, H]`.
    pub proj: Linear<T>,
    /// Per-head `attn.q_norm` weight `[hd]`.
    pub q_norm: T,
    /// Per-head `attn.k_norm` weight `[hd]`.
    pub k_norm: T,
    /// `mlp.gate_proj` `[I, H]`.
    pub gate: Linear<T>,
    /// `mlp.up_proj` `[I, H]`.
    pub up: Linear<T>,
    /// `mlp.down_proj` `[H, I]`.
    pub down: Linear<T>,
}

/// The whole tower's weights (values exactly those in the file): `T` is f32 values (the host
/// reference, the default) or a [`HostTensor`] of the memory-mapped file, read only when the
/// CUDA path uploads it ([`load_hf_mapped`]).
#[derive(Debug, Clone)]
pub struct GlmWeights<T = Vec<f32>> {
    /// `patch_embed.proj` as `[H, C·T·p²]` with bias.
    pub patch: Linear<T>,
    /// Vision blocks.
    pub blocks: Vec<Block<T>>,
    /// `post_layernorm` RMSNorm weight `[H]`.
    pub post_norm: T,
    /// `downsample` as `[O, 4H]`, columns (c, ky, kx), with bias.
    pub downsample: Linear<T>,
    /// `merger.proj` `[O, O]`, no bias.
    pub merger_proj: Linear<T>,
    /// `merger.post_projection_norm` LayerNorm weight `[O]`.
    pub merger_norm_w: T,
    /// `merger.post_projection_norm` LayerNorm bias `[O]`.
    pub merger_norm_b: T,
    /// `merger.gate_proj` `[Pi, O]`, no bias.
    pub merger_gate: Linear<T>,
    /// `merger.up_proj` `[Pi, O]`, no bias.
    pub merger_up: Linear<T>,
    /// `merger.down_proj` `[O, Pi]`, no bias.
    pub merger_down: Linear<T>,
}

fn name(suffix: &str) -> String {
    format!("{HF_PREFIX}{suffix}")
}

/// Shape of a tensor looked up with the `model.` tolerance; `None` when absent.
fn shape(ck: &Checkpoint, full: &str) -> Result<Option<Vec<usize>>> {
    match ck.find(full) {
        Ok(v) => Ok(Some(v.shape().to_vec())),
        Err(StError::TensorNotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// How a loader turns a tensor of the file into its store (f32 values, or a mapped view).
type Read<'a, T> = dyn Fn(TensorView<'a>) -> Result<T> + 'a;

/// A float tensor of the memory-mapped file, read in place at upload (F32, F16, BF16); any
/// other dtype gives the reader's own refusal.
fn mapped(v: TensorView<'_>) -> Result<HostTensor<'_>> {
    let dtype = LeDtype::from_safetensors(v.dtype().as_str());
    HostTensor::in_place(v.bytes(), dtype, || Ok(v.to_f32()?))
}

/// Reads `suffix` (under `model.visual.`) with `read`, checking its shape first.
fn get<'a, T>(
    ck: &'a Checkpoint,
    suffix: &str,
    expected: &[usize],
    read: &Read<'a, T>,
) -> Result<T> {
    let full = name(suffix);
    let found = shape(ck, &full)?.ok_or_else(|| GlmError::MissingTensor(full.clone()))?;
    if found != expected {
        return Err(GlmError::Shape {
            name: full,
            found,
            expected: expected.to_vec(),
        });
    }
    read(ck.find(&full)?)
}

/// Reads a linear `stem.weight` `[out, ..]` (any trailing shape whose product is `inp`, given
/// as `w_shape`) and, when `bias`, `stem.bias` `[out]`.
fn linear<'a, T>(
    (ck, read): (&'a Checkpoint, &Read<'a, T>),
    stem: &str,
    w_shape: &[usize],
    out: usize,
    inp: usize,
    bias: bool,
) -> Result<Linear<T>> {
    let w = get(ck, &format!("{stem}.weight"), w_shape, read)?;
    let b = if bias {
        Some(get(ck, &format!("{stem}.bias"), &[out], read)?)
    } else {
        None
    };
    Ok(Linear { w, b, out, inp })
}

/// Every `model.visual.*` name the config implies, used to refuse unknown ones.
fn known_names(cfg: &GlmConfig) -> BTreeSet<String> {
    let mut set = BTreeSet::new();
    let mut add = |s: String| {
        set.insert(name(&s));
    };
    for s in [
        "patch_embed.proj.weight",
        "patch_embed.proj.bias",
        "post_layernorm.weight",
        "downsample.weight",
        "downsample.bias",
        "merger.proj.weight",
        "merger.post_projection_norm.weight",
        "merger.post_projection_norm.bias",
        "merger.gate_proj.weight",
        "merger.up_proj.weight",
        "merger.down_proj.weight",
    ] {
        add(s.to_string());
    }
    for i in 0..cfg.layers {
        for s in ["norm1", "norm2", "attn.q_norm", "attn.k_norm"] {
            add(format!("blocks.{i}.{s}.weight"));
        }
        for s in [
            "attn.qkv",
            "attn.proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ] {
            add(format!("blocks.{i}.{s}.weight"));
            if cfg.attention_bias {
                add(format!("blocks.{i}.{s}.bias"));
            }
        }
    }
    set
}

/// Refuses any vision tensor (`model.visual.*`, or `visual.*` in a release that drops the
/// `model.` prefix) that the config's scheme does not name.
fn check_census(ck: &Checkpoint, cfg: &GlmConfig) -> Result<()> {
    let known = known_names(cfg);
    for t in ck.tensors() {
        let canonical = if t.name.starts_with(HF_PREFIX) {
            t.name.clone()
        } else if t.name.starts_with("visual.") {
            format!("model.{}", t.name)
        } else {
            continue;
        };
        if !known.contains(&canonical) {
            return Err(GlmError::UnknownTensor(t.name.clone()));
        }
    }
    Ok(())
}

/// Where the vision blocks live (with and without the `model.` prefix).
const BLOCK_STEMS: [&str; 2] = ["model.visual.blocks.", "visual.blocks."];

/// Refuses a configured block count the checkpoint does not hold, before the census builds a
/// name per configured block: the first configured block with no tensor in the file is named by
/// its `norm1`. One pass over the file's names, whatever `depth` says; a block that is present
/// but incomplete is left to the census and the loader.
fn require_blocks(ck: &Checkpoint, layers: usize) -> Result<()> {
    let present: BTreeSet<usize> = ck
        .tensors()
        .filter_map(|t| {
            let rest = BLOCK_STEMS.iter().find_map(|s| t.name.strip_prefix(s))?;
            rest.split('.').next()?.parse().ok()
        })
        .collect();
    match (0..layers).find(|i| !present.contains(i)) {
        Some(l) => Err(GlmError::MissingTensor(name(&format!(
            "blocks.{l}.norm1.weight"
        )))),
        None => Ok(()),
    }
}

/// Loads an HF checkpoint, reading the config from its `config.json`.
pub fn load_hf(ck: &Checkpoint) -> Result<(GlmConfig, GlmWeights)> {
    probe(ck)?;
    let config = ck
        .config()
        .ok_or_else(|| GlmError::Config("the checkpoint has no config.json".into()))?;
    load_hf_with_config(ck, config)
}

fn probe(ck: &Checkpoint) -> Result<()> {
    match shape(ck, PROBE_TENSOR)? {
        Some(_) => Ok(()),
        None => Err(GlmError::NoVisionWeights(format!(
            "{PROBE_TENSOR} is absent (a text-only release?)"
        ))),
    }
}

/// Loads an HF checkpoint with the whole model's `config.json` given separately (for a
/// checkpoint opened from bytes, or a config edited by the caller).
pub fn load_hf_with_config(
    ck: &Checkpoint,
    config: &serde_json::Value,
) -> Result<(GlmConfig, GlmWeights)> {
    load_with(ck, config, &|v| Ok(v.to_f32()?))
}

/// Validates an HF checkpoint like [`load_hf`] but keeps every tensor as a view of the
/// memory-mapped file, converted only when the CUDA path uploads it.
pub fn load_hf_mapped(ck: &Checkpoint) -> Result<(GlmConfig, GlmWeights<HostTensor<'_>>)> {
    probe(ck)?;
    let config = ck
        .config()
        .ok_or_else(|| GlmError::Config("the checkpoint has no config.json".into()))?;
    load_with(ck, config, &mapped)
}

fn load_with<'a, T: TensorStore>(
    ck: &'a Checkpoint,
    config: &serde_json::Value,
    read: &Read<'a, T>,
) -> Result<(GlmConfig, GlmWeights<T>)> {
    probe(ck)?;
    let cfg = GlmConfig::from_hf(config)?;
    // Extra blocks are unknown tensors; a missing one is a missing tensor, named.
    require_blocks(ck, cfg.layers)?;
    check_census(ck, &cfg)?;
    let w = load(ck, &cfg, read)?;
    Ok((cfg, w))
}

fn load<'a, T: TensorStore>(
    ck: &'a Checkpoint,
    cfg: &GlmConfig,
    read: &Read<'a, T>,
) -> Result<GlmWeights<T>> {
    let src = (ck, read);
    let get = |suffix: &str, shape: &[usize]| get(ck, suffix, shape, read);
    let (h, i, o, pi, hd) = (
        cfg.hidden,
        cfg.intermediate,
        cfg.text_hidden,
        cfg.merger_inner,
        cfg.head_dim,
    );
    let (c, t, p, m) = (cfg.in_channels, cfg.temporal_patch, cfg.patch, cfg.merge);
    let bias = cfg.attention_bias;
    // Conv3d [H, C, T, p, p] with stride = kernel ≡ Linear over the (c, t, ky, kx) row + bias.
    let patch = linear(
        src,
        "patch_embed.proj",
        &[h, c, t, p, p],
        h,
        cfg.patch_dim(),
        true,
    )?;
    let mut blocks = Vec::with_capacity(cfg.layers);
    for l in 0..cfg.layers {
        let s = |n: &str| format!("blocks.{l}.{n}");
        blocks.push(Block {
            norm1: get(&s("norm1.weight"), &[h])?,
            norm2: get(&s("norm2.weight"), &[h])?,
            qkv: linear(src, &s("attn.qkv"), &[3 * h, h], 3 * h, h, bias)?,
            proj: linear(src, &s("attn.proj"), &[h, h], h, h, bias)?,
            q_norm: get(&s("attn.q_norm.weight"), &[hd])?,
            k_norm: get(&s("attn.k_norm.weight"), &[hd])?,
            gate: linear(src, &s("mlp.gate_proj"), &[i, h], i, h, bias)?,
            up: linear(src, &s("mlp.up_proj"), &[i, h], i, h, bias)?,
            down: linear(src, &s("mlp.down_proj"), &[h, i], h, i, bias)?,
        });
    }
    Ok(GlmWeights {
        patch,
        blocks,
        post_norm: get("post_layernorm.weight", &[h])?,
        // Conv2d [O, H, m, m], stride m: row-major flattening is exactly [O, H·m²] with
        // columns (c, ky, kx), the order `host::block_gather_2x2` writes.
        downsample: linear(src, "downsample", &[o, h, m, m], o, h * m * m, true)?,
        merger_proj: linear(src, "merger.proj", &[o, o], o, o, false)?,
        merger_norm_w: get("merger.post_projection_norm.weight", &[o])?,
        merger_norm_b: get("merger.post_projection_norm.bias", &[o])?,
        merger_gate: linear(src, "merger.gate_proj", &[pi, o], pi, o, false)?,
        merger_up: linear(src, "merger.up_proj", &[pi, o], pi, o, false)?,
        merger_down: linear(src, "merger.down_proj", &[o, pi], o, pi, false)?,
    })
}
