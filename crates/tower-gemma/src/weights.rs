//! Loading the Gemma-4 vision weights from either source into one host layout.
//!
//! Both sources land in the HF layout: linear weights `[out, in]`, the patch projection's
//! columns in (ky, kx, c) order, the position tables `[2, rows, H]` (x table first).

use crate::config::{GemmaConfig, GgufActivation};
use crate::error::{GemmaError, Result};
use gguf_reader::{GgmlType, GgufFile};
use gpu_core::{Clamp, HostTensor, LeDtype, TensorStore};
use st_reader::Checkpoint;
use std::collections::BTreeSet;

/// One ClippableLinear: `clamp_out(W·clamp_in(x))`, no bias.
#[derive(Debug, Clone)]
pub struct Linear<T = Vec<f32>> {
    /// `[out, in]`, row-major.
    pub w: T,
    /// Output width.
    pub out: usize,
    /// Input width.
    pub inp: usize,
    /// Clamp of the input (ClippableLinear `input_min/max`), or none.
    pub clamp_in: Clamp,
    /// Clamp of the output (ClippableLinear `output_min/max`), or none.
    pub clamp_out: Clamp,
}

/// One encoder layer's weights.
#[derive(Debug, Clone)]
pub struct Layer<T = Vec<f32>> {
    /// `input_layernorm` (before attention).
    pub ln_in: T,
    /// `post_attention_layernorm` (sandwich norm on the attention output).
    pub ln_post_attn: T,
    /// `pre_feedforward_layernorm`.
    pub ln_pre_ffn: T,
    /// `post_feedforward_layernorm`.
    pub ln_post_ffn: T,
    /// q, k, v, o projections.
    pub q: Linear<T>,
    /// See `q`.
    pub k: Linear<T>,
    /// See `q`.
    pub v: Linear<T>,
    /// See `q`.
    pub o: Linear<T>,
    /// Per-head q RMSNorm weight `[head_dim]`.
    pub q_norm: T,
    /// Per-head k RMSNorm weight `[head_dim]`.
    pub k_norm: T,
    /// MLP gate, up and down projections.
    pub gate: Linear<T>,
    /// See `gate`.
    pub up: Linear<T>,
    /// See `gate`.
    pub down: Linear<T>,
}

/// The whole tower's weights (values exactly those in the file): `T` is f32 values (the host
/// reference, the default) or a [`HostTensor`] of the memory-mapped file, read only when the
/// CUDA path uploads it ([`load_hf_mapped`], [`load_gguf_mapped`]).
#[derive(Debug, Clone)]
pub struct GemmaWeights<T = Vec<f32>> {
    /// `input_proj` `[H, 3·p²]`, columns (ky, kx, c).
    pub patch: T,
    /// Position tables `[2, rows, H]`: `[0]` indexed by x (column), `[1]` by y (row).
    pub pos: T,
    /// Encoder layers.
    pub layers: Vec<Layer<T>>,
    /// `std_bias` and `std_scale` `[H]` when the config standardises.
    pub standardize: Option<(T, T)>,
    /// Embedder `embedding_projection` `[text_hidden, H]`.
    pub proj: T,
}

/// Where the tower's tensors come from: a name scheme over one of the two readers.
trait Source<'a> {
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    fn f32(&self, name: &str) -> Result<Vec<f32>>;
    /// The tensor in place in the file (F32/F16/BF16 bytes), else decoded to f32.
    fn mapped(&self, name: &str) -> Result<HostTensor<'a>>;
}

/// How a loader stores a tensor it reads from a [`Source`].
trait Fetch<'a>: TensorStore {
    fn fetch(src: &dyn Source<'a>, name: &str) -> Result<Self>;
}

impl<'a> Fetch<'a> for Vec<f32> {
    fn fetch(src: &dyn Source<'a>, name: &str) -> Result<Self> {
        src.f32(name)
    }
}

impl<'a> Fetch<'a> for HostTensor<'a> {
    fn fetch(src: &dyn Source<'a>, name: &str) -> Result<Self> {
        src.mapped(name)
    }
}

struct HfSource<'a>(&'a Checkpoint);

impl<'a> Source<'a> for HfSource<'a> {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.0.find(name).ok().map(|v| v.shape().to_vec())
    }
    fn f32(&self, name: &str) -> Result<Vec<f32>> {
        let view = self
            .0
            .find(name)
            .map_err(|_| GemmaError::MissingTensor(name.to_string()))?;
        Ok(view.to_f32()?)
    }
    fn mapped(&self, name: &str) -> Result<HostTensor<'a>> {
        let view = self
            .0
            .find(name)
            .map_err(|_| GemmaError::MissingTensor(name.to_string()))?;
        let dtype = LeDtype::from_safetensors(view.dtype().as_str());
        HostTensor::in_place(view.bytes(), dtype, || Ok(view.to_f32()?))
    }
}

struct GgufSource<'a>(&'a GgufFile);

impl<'a> Source<'a> for GgufSource<'a> {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.0.tensor(name).map(|t| {
            t.shape()
                .iter()
                .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
                .collect()
        })
    }
    fn f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self
            .0
            .tensor(name)
            .ok_or_else(|| GemmaError::MissingTensor(name.to_string()))?;
        Ok(self.0.to_f32(info)?)
    }
    fn mapped(&self, name: &str) -> Result<HostTensor<'a>> {
        let g = self.0;
        let info = g
            .tensor(name)
            .ok_or_else(|| GemmaError::MissingTensor(name.to_string()))?;
        let dtype = match info.ggml_type {
            GgmlType::F32 => Some(LeDtype::F32),
            GgmlType::F16 => Some(LeDtype::F16),
            GgmlType::BF16 => Some(LeDtype::Bf16),
            _ => None,
        };
        HostTensor::in_place(g.view(info)?.bytes(), dtype, || Ok(g.to_f32(info)?))
    }
}

/// Reads `name`, checking its shape first.
fn get<'a, T: Fetch<'a>>(src: &dyn Source<'a>, name: &str, expected: &[usize]) -> Result<T> {
    let found = src
        .shape(name)
        .ok_or_else(|| GemmaError::MissingTensor(name.to_string()))?;
    if found != expected {
        return Err(GemmaError::Shape {
            name: name.to_string(),
            found,
            expected: expected.to_vec(),
        });
    }
    T::fetch(src, name)
}

/// Reads a scalar clamp bound (shape `[]` or `[1]`).
fn scalar(src: &dyn Source<'_>, name: &str) -> Result<f32> {
    let found = src
        .shape(name)
        .ok_or_else(|| GemmaError::MissingTensor(name.to_string()))?;
    if found.iter().product::<usize>() != 1 {
        return Err(GemmaError::Shape {
            name: name.to_string(),
            found,
            expected: vec![1],
        });
    }
    let v = src.f32(name)?;
    v.first()
        .copied()
        .ok_or_else(|| GemmaError::MissingTensor(name.to_string()))
}

/// The names of one source's scheme; `lin` maps (layer, HF linear name) to the tensor stem.
struct Names {
    patch: String,
    pos: String,
    std_bias: String,
    std_scale: String,
    proj: String,
    norm: fn(usize, &str) -> String,
    lin: fn(usize, &str) -> String,
    /// The suffix of a clamp bound after the linear's stem (`.input_min`, …).
    clamp_sep: &'static str,
}

const HF_PREFIX: &str = "model.vision_tower.";
const HF_EMBED: &str = "model.embed_vision.embedding_projection.weight";

fn hf_names() -> Names {
    Names {
        patch: format!("{HF_PREFIX}patch_embedder.input_proj.weight"),
        pos: format!("{HF_PREFIX}patch_embedder.position_embedding_table"),
        std_bias: format!("{HF_PREFIX}std_bias"),
        std_scale: format!("{HF_PREFIX}std_scale"),
        proj: HF_EMBED.to_string(),
        norm: |i, n| {
            let hf = match n {
                "ln_in" => "input_layernorm",
                "ln_post_attn" => "post_attention_layernorm",
                "ln_pre_ffn" => "pre_feedforward_layernorm",
                "ln_post_ffn" => "post_feedforward_layernorm",
                "q_norm" => "self_attn.q_norm",
                _ => "self_attn.k_norm",
            };
            format!("{HF_PREFIX}encoder.layers.{i}.{hf}.weight")
        },
        lin: |i, n| {
            let hf = match n {
                "q" => "self_attn.q_proj",
                "k" => "self_attn.k_proj",
                "v" => "self_attn.v_proj",
                "o" => "self_attn.o_proj",
                "gate" => "mlp.gate_proj",
                "up" => "mlp.up_proj",
                _ => "mlp.down_proj",
            };
            format!("{HF_PREFIX}encoder.layers.{i}.{hf}")
        },
        clamp_sep: ".",
    }
}

fn gguf_names() -> Names {
    Names {
        patch: "v.patch_embd.weight".into(),
        pos: "v.position_embd.weight".into(),
        std_bias: "v.std_bias".into(),
        std_scale: "v.std_scale".into(),
        proj: "mm.input_projection.weight".into(),
        norm: |i, n| {
            let g = match n {
                "ln_in" => "ln1",
                "ln_post_attn" => "attn_post_norm",
                "ln_pre_ffn" => "ln2",
                "ln_post_ffn" => "ffn_post_norm",
                "q_norm" => "attn_q_norm",
                _ => "attn_k_norm",
            };
            format!("v.blk.{i}.{g}.weight")
        },
        lin: |i, n| {
            let g = match n {
                "q" => "attn_q",
                "k" => "attn_k",
                "v" => "attn_v",
                "o" => "attn_out",
                "gate" => "ffn_gate",
                "up" => "ffn_up",
                _ => "ffn_down",
            };
            format!("v.blk.{i}.{g}")
        },
        clamp_sep: ".",
    }
}

/// The weight of a linear: HF nests it as `<stem>.linear.weight`, GGUF as `<stem>.weight`.
fn lin_weight(names: &Names, hf: bool, i: usize, n: &str) -> String {
    let stem = (names.lin)(i, n);
    if hf {
        format!("{stem}.linear.weight")
    } else {
        format!("{stem}.weight")
    }
}

const LINEARS: [&str; 7] = ["q", "k", "v", "o", "gate", "up", "down"];
const NORMS: [&str; 6] = [
    "ln_in",
    "ln_post_attn",
    "ln_pre_ffn",
    "ln_post_ffn",
    "q_norm",
    "k_norm",
];
const CLAMPS: [&str; 4] = ["input_min", "input_max", "output_min", "output_max"];

/// Every tensor name of the scheme for `layers` layers, used to refuse unknown ones.
fn known_names(
    names: &Names,
    hf: bool,
    layers: usize,
    clipped: bool,
    standardize: bool,
) -> BTreeSet<String> {
    let mut set: BTreeSet<String> =
        [names.patch.clone(), names.pos.clone(), names.proj.clone()].into();
    if standardize {
        set.insert(names.std_bias.clone());
        set.insert(names.std_scale.clone());
    }
    for i in 0..layers {
        for n in NORMS {
            set.insert((names.norm)(i, n));
        }
        for n in LINEARS {
            set.insert(lin_weight(names, hf, i, n));
            if clipped {
                for c in CLAMPS {
                    set.insert(format!("{}{}{c}", (names.lin)(i, n), names.clamp_sep));
                }
            }
        }
    }
    set
}

fn load<'a, T: Fetch<'a>>(
    src: &dyn Source<'a>,
    names: &Names,
    hf: bool,
    cfg: &GemmaConfig,
    conv_patch: bool,
) -> Result<GemmaWeights<T>> {
    let (h, inner, hd) = (cfg.hidden, cfg.intermediate, cfg.head_dim);
    let qkv = cfg.heads * hd;
    let pd = cfg.patch_dim();
    let patch = if conv_patch {
        // llama.cpp conv layout [H, 3, p, p] → HF columns (ky, kx, c).
        let p = cfg.patch;
        let conv: Vec<f32> = get(src, &names.patch, &[h, 3, p, p])?;
        let mut out = vec![0.0f32; h * pd];
        for o in 0..h {
            for c in 0..3 {
                for ky in 0..p {
                    for kx in 0..p {
                        out[o * pd + (ky * p + kx) * 3 + c] = conv[((o * 3 + c) * p + ky) * p + kx];
                    }
                }
            }
        }
        T::from_f32(out)
    } else {
        get(src, &names.patch, &[h, pd])?
    };
    let pos = get(src, &names.pos, &[2, cfg.pos_rows, h])?;
    let linear = |i: usize, n: &str, out: usize, inp: usize| -> Result<Linear<T>> {
        let w = get(src, &lin_weight(names, hf, i, n), &[out, inp])?;
        let (clamp_in, clamp_out) = if cfg.clipped {
            let b = |c: &str| scalar(src, &format!("{}{}{c}", (names.lin)(i, n), names.clamp_sep));
            (
                Clamp::new(b("input_min")?, b("input_max")?),
                Clamp::new(b("output_min")?, b("output_max")?),
            )
        } else {
            (Clamp::NONE, Clamp::NONE)
        };
        Ok(Linear {
            w,
            out,
            inp,
            clamp_in,
            clamp_out,
        })
    };
    let mut layers = Vec::with_capacity(cfg.layers);
    for i in 0..cfg.layers {
        let norm = |n: &str, d: usize| get(src, &(names.norm)(i, n), &[d]);
        layers.push(Layer {
            ln_in: norm("ln_in", h)?,
            ln_post_attn: norm("ln_post_attn", h)?,
            ln_pre_ffn: norm("ln_pre_ffn", h)?,
            ln_post_ffn: norm("ln_post_ffn", h)?,
            q_norm: norm("q_norm", hd)?,
            k_norm: norm("k_norm", hd)?,
            q: linear(i, "q", qkv, h)?,
            k: linear(i, "k", qkv, h)?,
            v: linear(i, "v", qkv, h)?,
            o: linear(i, "o", h, qkv)?,
            gate: linear(i, "gate", inner, h)?,
            up: linear(i, "up", inner, h)?,
            down: linear(i, "down", h, inner)?,
        });
    }
    let standardize = if cfg.standardize {
        Some((
            get(src, &names.std_bias, &[h])?,
            get(src, &names.std_scale, &[h])?,
        ))
    } else {
        None
    };
    let proj = get(src, &names.proj, &[cfg.text_hidden, h])?;
    Ok(GemmaWeights {
        patch,
        pos,
        layers,
        standardize,
        proj,
    })
}

/// Counts encoder layers present under a scheme (the first absent `ln_in` ends the count).
fn count_layers(src: &dyn Source<'_>, names: &Names) -> usize {
    (0..)
        .take_while(|&i| src.shape(&(names.norm)(i, "ln_in")).is_some())
        .count()
}

/// Where the HF encoder layers live (with and without the `model.` prefix st-reader tolerates).
const HF_LAYER_STEMS: [&str; 2] = [
    "model.vision_tower.encoder.layers.",
    "vision_tower.encoder.layers.",
];

/// The layer index of `name` if it lies under one of `stems` (`<stem><i>.…`).
fn layer_index(name: &str, stems: &[&str]) -> Option<usize> {
    let rest = stems.iter().find_map(|s| name.strip_prefix(s))?;
    rest.split('.').next()?.parse().ok()
}

/// Refuses a configured layer count the file does not hold, before anything is sized by it
/// (the census builds a name per configured layer): the first configured layer with no tensor
/// in the file is named by its `ln_in`. One pass over the file's names, whatever the count; a
/// layer that is present but incomplete is left to the census and the loader.
fn require_layers<'a>(
    file: impl Iterator<Item = &'a str>,
    stems: &[&str],
    names: &Names,
    layers: usize,
) -> Result<()> {
    let present: BTreeSet<usize> = file.filter_map(|n| layer_index(n, stems)).collect();
    match (0..layers).find(|i| !present.contains(i)) {
        Some(i) => Err(GemmaError::MissingTensor((names.norm)(i, "ln_in"))),
        None => Ok(()),
    }
}

/// Loads an HF checkpoint (`model.vision_tower.*` + `model.embed_vision.*`) into host f32.
pub fn load_hf(ck: &Checkpoint) -> Result<(GemmaConfig, GemmaWeights)> {
    load_hf_with(ck)
}

/// Validates an HF checkpoint like [`load_hf`] but keeps every tensor as a view of the
/// memory-mapped file, converted only when the CUDA path uploads it.
pub fn load_hf_mapped(ck: &Checkpoint) -> Result<(GemmaConfig, GemmaWeights<HostTensor<'_>>)> {
    load_hf_with(ck)
}

fn load_hf_with<'a, T: Fetch<'a>>(ck: &'a Checkpoint) -> Result<(GemmaConfig, GemmaWeights<T>)> {
    let names = hf_names();
    let src = HfSource(ck);
    let pos_shape = src
        .shape(&names.pos)
        .ok_or_else(|| GemmaError::NoVisionWeights(format!("{} is absent", names.pos)))?;
    let pos_rows = pos_shape.get(1).copied().unwrap_or(0);
    let clipped = src
        .shape(&format!("{}.input_min", (names.lin)(0, "q")))
        .is_some();
    let config = ck
        .config()
        .ok_or_else(|| GemmaError::Config("the checkpoint has no config.json".into()))?;
    let cfg = GemmaConfig::from_hf(config, pos_rows, clipped)?;
    require_layers(
        ck.tensors().map(|t| t.name.as_str()),
        &HF_LAYER_STEMS,
        &names,
        cfg.layers,
    )?;
    check_census(
        ck.tensors().map(|t| t.name.as_str()),
        &["model.vision_tower.", "model.embed_vision."],
        &known_names(&names, true, cfg.layers, cfg.clipped, cfg.standardize),
        &["model."],
    )?;
    let w = load(&src, &names, true, &cfg, false)?;
    Ok((cfg, w))
}

/// Loads a llama.cpp mmproj GGUF (`v.*`, `mm.input_projection.weight`) into host f32.
pub fn load_gguf(g: &GgufFile, activation: GgufActivation) -> Result<(GemmaConfig, GemmaWeights)> {
    load_gguf_with(g, activation)
}

/// Validates an mmproj GGUF like [`load_gguf`] but keeps F32/F16/BF16 tensors as views of the
/// memory-mapped file (a quantised tensor is decoded to f32 on its own), for the CUDA path.
pub fn load_gguf_mapped(
    g: &GgufFile,
    activation: GgufActivation,
) -> Result<(GemmaConfig, GemmaWeights<HostTensor<'_>>)> {
    load_gguf_with(g, activation)
}

fn load_gguf_with<'a, T: Fetch<'a>>(
    g: &'a GgufFile,
    activation: GgufActivation,
) -> Result<(GemmaConfig, GemmaWeights<T>)> {
    match g.get("clip.vision.projector_type").and_then(|v| v.as_str()) {
        Some("gemma4v") => {}
        other => {
            return Err(GemmaError::NoVisionWeights(format!(
                "clip.vision.projector_type is {other:?}, not \"gemma4v\""
            )))
        }
    }
    let names = gguf_names();
    let src = GgufSource(g);
    let pos_rows = src
        .shape(&names.pos)
        .and_then(|s| s.get(1).copied())
        .unwrap_or(0);
    let clipped = src
        .shape(&format!("{}.input_min", (names.lin)(0, "q")))
        .is_some();
    let standardize = src.shape(&names.std_bias).is_some();
    let cfg = GemmaConfig::from_gguf(g, pos_rows, clipped, standardize, activation)?;
    let layers = count_layers(&src, &names);
    if layers != cfg.layers {
        return Err(GemmaError::Config(format!(
            "clip.vision.block_count is {} but the file has {layers} blocks",
            cfg.layers
        )));
    }
    check_census(
        g.tensors().iter().map(|t| t.name.as_str()),
        &["v.", "mm."],
        &known_names(&names, false, cfg.layers, cfg.clipped, cfg.standardize),
        &[],
    )?;
    let w = load(&src, &names, false, &cfg, true)?;
    Ok((cfg, w))
}

/// Refuses any tensor under the tower's prefixes that the scheme does not name. `strip` lists
/// prefixes a checkpoint may add or drop (st-reader's lookup tolerates `model.`).
fn check_census<'a>(
    names: impl Iterator<Item = &'a str>,
    prefixes: &[&str],
    known: &BTreeSet<String>,
    strip: &[&str],
) -> Result<()> {
    for name in names {
        let canonical = if prefixes.iter().any(|p| name.starts_with(p)) {
            name.to_string()
        } else if let Some(p) = strip.iter().find(|p| {
            prefixes
                .iter()
                .any(|q| q.strip_prefix(**p).is_some_and(|r| name.starts_with(r)))
        }) {
            format!("{p}{name}")
        } else {
            continue;
        };
        if !known.contains(&canonical) {
            return Err(GemmaError::UnknownTensor(name.to_string()));
        }
    }
    Ok(())
}
