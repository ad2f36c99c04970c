//! Loading the GLM vision weights (`model.visual.*`) from an HF checkpoint into host f32.
//!
//! Layouts are HF's: linear weights `[out, in]`; the Conv3d patch embedding `[H, C, T, p, p]`
//! is used as `[H, C·T·p²]` (columns (c, t, ky, kx), the processor's row order); the Conv2d
//! downsample `[O, H, 2, 2]` as `[O, 4H]` (columns (c, ky, kx)).

use crate::config::GlmConfig;
use crate::error::{GlmError, Result};
use st_reader::{Checkpoint, StError};
use std::collections::BTreeSet;

/// The canonical prefix of every vision tensor in a whole-model checkpoint.
pub const HF_PREFIX: &str = "model.visual.";
/// The tensor whose presence says the checkpoint has a vision tower at all.
pub const PROBE_TENSOR: &str = "model.visual.patch_embed.proj.weight";

/// A dense linear `y = W·x (+ b)`.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, inp]`, row-major.
    pub w: Vec<f32>,
    /// `[out]`, when the layer has a bias.
    pub b: Option<Vec<f32>>,
    /// Output width.
    pub out: usize,
    /// Input width.
    pub inp: usize,
}

/// One vision block's weights.
#[derive(Debug, Clone)]
pub struct Block {
    /// `norm1` RMSNorm weight `[H]` (before attention).
    pub norm1: Vec<f32>,
    /// `norm2` RMSNorm weight `[H]` (before the MLP).
    pub norm2: Vec<f32>,
    /// Fused `attn.qkv` `[3H, H]` (rows q | k | v, each head-contiguous).
    pub qkv: Linear,
    /// `attn.proj` `[H, H]`.
    pub proj: Linear,
    /// Per-head `attn.q_norm` weight `[hd]`.
    pub q_norm: Vec<f32>,
    /// Per-head `attn.k_norm` weight `[hd]`.
    pub k_norm: Vec<f32>,
    /// `mlp.gate_proj` `[I, H]`.
    pub gate: Linear,
    /// `mlp.up_proj` `[I, H]`.
    pub up: Linear,
    /// `mlp.down_proj` `[H, I]`.
    pub down: Linear,
}

/// The whole tower's weights in f32 on the host (values exactly those in the file).
#[derive(Debug, Clone)]
pub struct GlmWeights {
    /// `patch_embed.proj` as `[H, C·T·p²]` with bias.
    pub patch: Linear,
    /// Vision blocks.
    pub blocks: Vec<Block>,
    /// `post_layernorm` RMSNorm weight `[H]`.
    pub post_norm: Vec<f32>,
    /// `downsample` as `[O, 4H]`, columns (c, ky, kx), with bias.
    pub downsample: Linear,
    /// `merger.proj` `[O, O]`, no bias.
    pub merger_proj: Linear,
    /// `merger.post_projection_norm` LayerNorm weight `[O]`.
    pub merger_norm_w: Vec<f32>,
    /// `merger.post_projection_norm` LayerNorm bias `[O]`.
    pub merger_norm_b: Vec<f32>,
    /// `merger.gate_proj` `[Pi, O]`, no bias.
    pub merger_gate: Linear,
    /// `merger.up_proj` `[Pi, O]`, no bias.
    pub merger_up: Linear,
    /// `merger.down_proj` `[O, Pi]`, no bias.
    pub merger_down: Linear,
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

/// Reads `suffix` (under `model.visual.`), checking its shape first.
fn get(ck: &Checkpoint, suffix: &str, expected: &[usize]) -> Result<Vec<f32>> {
    let full = name(suffix);
    let found = shape(ck, &full)?.ok_or_else(|| GlmError::MissingTensor(full.clone()))?;
    if found != expected {
        return Err(GlmError::Shape {
            name: full,
            found,
            expected: expected.to_vec(),
        });
    }
    Ok(ck.find(&full)?.to_f32()?)
}

/// Reads a linear `stem.weight` `[out, ..]` (any trailing shape whose product is `inp`, given
/// as `w_shape`) and, when `bias`, `stem.bias` `[out]`.
fn linear(
    ck: &Checkpoint,
    stem: &str,
    w_shape: &[usize],
    out: usize,
    inp: usize,
    bias: bool,
) -> Result<Linear> {
    let w = get(ck, &format!("{stem}.weight"), w_shape)?;
    let b = if bias {
        Some(get(ck, &format!("{stem}.bias"), &[out])?)
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
    probe(ck)?;
    let cfg = GlmConfig::from_hf(config)?;
    // Extra blocks are unknown tensors; a missing one is a missing tensor, named.
    require_blocks(ck, cfg.layers)?;
    check_census(ck, &cfg)?;
    let w = load(ck, &cfg)?;
    Ok((cfg, w))
}

fn load(ck: &Checkpoint, cfg: &GlmConfig) -> Result<GlmWeights> {
    let (h, i, o, pi, hd) = (
        cfg.hidden,
        cfg.intermediate,
        cfg.out_hidden,
        cfg.merger_inner,
        cfg.head_dim,
    );
    let (c, t, p, m) = (cfg.in_channels, cfg.temporal_patch, cfg.patch, cfg.merge);
    let bias = cfg.attention_bias;
    // Conv3d [H, C, T, p, p] with stride = kernel ≡ Linear over the (c, t, ky, kx) row + bias.
    let patch = linear(
        ck,
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
            norm1: get(ck, &s("norm1.weight"), &[h])?,
            norm2: get(ck, &s("norm2.weight"), &[h])?,
            qkv: linear(ck, &s("attn.qkv"), &[3 * h, h], 3 * h, h, bias)?,
            proj: linear(ck, &s("attn.proj"), &[h, h], h, h, bias)?,
            q_norm: get(ck, &s("attn.q_norm.weight"), &[hd])?,
            k_norm: get(ck, &s("attn.k_norm.weight"), &[hd])?,
            gate: linear(ck, &s("mlp.gate_proj"), &[i, h], i, h, bias)?,
            up: linear(ck, &s("mlp.up_proj"), &[i, h], i, h, bias)?,
            down: linear(ck, &s("mlp.down_proj"), &[h, i], h, i, bias)?,
        });
    }
    Ok(GlmWeights {
        patch,
        blocks,
        post_norm: get(ck, "post_layernorm.weight", &[h])?,
        // Conv2d [O, H, m, m], stride m: row-major flattening is exactly [O, H·m²] with
        // columns (c, ky, kx), the order `host::block_gather_2x2` writes.
        downsample: linear(ck, "downsample", &[o, h, m, m], o, h * m * m, true)?,
        merger_proj: linear(ck, "merger.proj", &[o, o], o, o, false)?,
        merger_norm_w: get(ck, "merger.post_projection_norm.weight", &[o])?,
        merger_norm_b: get(ck, "merger.post_projection_norm.bias", &[o])?,
        merger_gate: linear(ck, "merger.gate_proj", &[pi, o], pi, o, false)?,
        merger_up: linear(ck, "merger.up_proj", &[pi, o], pi, o, false)?,
        merger_down: linear(ck, "merger.down_proj", &[o, pi], o, pi, false)?,
    })
}
