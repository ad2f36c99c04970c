//! Loading the Step-3.7 vision weights from either layout into one host layout.
//!
//! Two layouts exist (UPSTREAM_SPEC §4.2, conversion_mapping.py:1124-1199):
//! - **vendor** (what releases ship and `save_pretrained` writes): `conv1`, `positional_embedding`,
//!   `ln_pre`, `transformer.resblocks.N.{ln_1, ln_2, attn.in_proj_*, attn.out_proj, ls_1.gamma,
//!   ls_2.gamma, mlp.c_fc, mlp.c_proj}`, `vit_downsampler{1,2}` under `vision_model.` or
//!   `model.vision_model.`, projector `vit_large_projector.weight` (or `model.`-prefixed);
//! - **HF** (upstream's own `state_dict()`): `model.vision_model.{embeddings, pre_layernorm,
//!   layers.N.self_attn.{q,k,v}_proj, …, downsampler{1,2}}`, projector
//!   `model.multi_modal_projector.weight`, with q/k rows **rope-permuted** per head
//!   (core_model_loading.py:465-491 `PermuteForRope`: HF row `s·hd/2 + i` = vendor row `2i + s`).
//!
//! Both land in the same host structs: the fused qkv `[3H, H]` as the file has it (vendor: as
//! is; HF: q, k, v stacked) and the rope pairing that matches it ([`WeightLayout::rope`]), so the
//! two layouts give the same rows without re-permuting anything. Conv weights keep their
//! `[out, in, ky, kx]` order, which is a GEMM matrix with columns (c, ky, kx).

use crate::config::{StepConfig, NUM_CHANNELS};
use crate::error::{Result, StepError};
use gpu_core::{HostTensor, LeDtype, RopeLayout, TensorStore};
use st_reader::{Checkpoint, TensorView};
use std::collections::BTreeSet;

/// Prefixes the vision tower lives under: `save_pretrained` writes `vision_model.`, HF's
/// `state_dict()` and the NVFP4 release use `model.vision_model.` (conversion_mapping.py:1126).
pub const VISION_PREFIXES: [&str; 2] = ["vision_model.", "model.vision_model."];
/// Where the vendor projector lives (`vit_large_projector.` → HF `model.multi_modal_projector.`,
/// conversion_mapping.py:1127; the NVFP4 release adds `model.`).
pub const VENDOR_PROJECTOR_PREFIXES: [&str; 2] =
    ["vit_large_projector.", "model.vit_large_projector."];
/// Where the HF projector lives (`Step3p7Model.multi_modal_projector`).
pub const HF_PROJECTOR_PREFIXES: [&str; 2] =
    ["model.multi_modal_projector.", "multi_modal_projector."];

/// Which tensor layout a checkpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightLayout {
    /// Fused `attn.in_proj_weight` with un-permuted q/k: interleaved rope pairs `(2i, 2i+1)`.
    Vendor,
    /// Split `q_proj`/`k_proj`/`v_proj` with rope-permuted q/k: NeoX pairs `(d, d + hd/2)`.
    Hf,
}

impl WeightLayout {
    /// The rope pairing that matches this layout's q/k rows (UPSTREAM_SPEC §4.4).
    pub fn rope(self) -> RopeLayout {
        match self {
            WeightLayout::Vendor => RopeLayout::Step3p7Vendor,
            WeightLayout::Hf => RopeLayout::Step3p7Hf,
        }
    }
}

/// One encoder layer's weights (`Step3p7VisionEncoderLayer`).
#[derive(Debug, Clone)]
pub struct Layer<T = Vec<f32>> {
    /// `layernorm_before` / `ln_1` weight `[H]`.
    pub ln1_w: T,
    /// `layernorm_before` / `ln_1` bias `[H]`.
    pub ln1_b: T,
    /// Fused q, k, v weight `[3H, H]` in the file's layout (see [`WeightLayout`]).
    pub qkv_w: T,
    /// Fused q, k, v bias `[3H]`.
    pub qkv_b: T,
    /// `out_proj` weight `[H, H]`.
    pub out_w: T,
    /// `out_proj` bias `[H]`.
    pub out_b: T,
    /// LayerScale of the attention branch (`lambda_1` / `ls_1.gamma`) `[H]`.
    pub ls1: T,
    /// `layernorm_after` / `ln_2` weight `[H]`.
    pub ln2_w: T,
    /// `layernorm_after` / `ln_2` bias `[H]`.
    pub ln2_b: T,
    /// `fc1` / `c_fc` weight `[I, H]`.
    pub fc1_w: T,
    /// `fc1` / `c_fc` bias `[I]`.
    pub fc1_b: T,
    /// `fc2` / `c_proj` weight `[H, I]`.
    pub fc2_w: T,
    /// `fc2` / `c_proj` bias `[H]`.
    pub fc2_b: T,
    /// LayerScale of the MLP branch (`lambda_2` / `ls_2.gamma`) `[H]`.
    pub ls2: T,
}

/// The whole tower's weights (values exactly those in the file).
///
/// `T` is how each tensor is held: f32 values (the host reference, the default) or a
/// [`HostTensor`] of the memory-mapped file, read only when the CUDA path uploads it
/// ([`load_mapped`]).
#[derive(Debug, Clone)]
pub struct StepWeights<T = Vec<f32>> {
    /// The layout the file used; decides the rope pairing.
    pub layout: WeightLayout,
    /// Patch conv `[H, 3, p, p]` = GEMM `[H, 3p²]` with columns (c, ky, kx); no bias.
    pub patch: T,
    /// Learned position table `[side², H]`, row-major over (row, col).
    pub pos: T,
    /// `pre_layernorm` / `ln_pre` weight `[H]`.
    pub ln_pre_w: T,
    /// `pre_layernorm` / `ln_pre` bias `[H]`.
    pub ln_pre_b: T,
    /// Encoder layers.
    pub layers: Vec<Layer<T>>,
    /// `downsampler1` `[2H, H, 3, 3]` = GEMM `[2H, 9H]`, columns (c, ky, kx).
    pub down1_w: T,
    /// `downsampler1` bias `[2H]`.
    pub down1_b: T,
    /// `downsampler2` `[4H, 2H, 3, 3]` = GEMM `[4H, 18H]`.
    pub down2_w: T,
    /// `downsampler2` bias `[4H]`.
    pub down2_b: T,
    /// `multi_modal_projector` / `vit_large_projector` weight `[text_H, 4H]`.
    pub proj: T,
    /// Projector bias `[text_H]` when `projector_bias` (never in a release).
    pub proj_b: Option<T>,
}

/// One layout's tensor names relative to the vision prefix (and the projector's stem).
struct Scheme {
    layout: WeightLayout,
    patch: &'static str,
    pos: &'static str,
    ln_pre: &'static str,
    down1: &'static str,
    down2: &'static str,
    /// Layer stem, e.g. `transformer.resblocks.{i}.`.
    layer: fn(usize) -> String,
    /// What precedes the layer index in the stem, e.g. `transformer.resblocks.`.
    layer_prefix: &'static str,
    ln1: &'static str,
    ln2: &'static str,
    out: &'static str,
    ls1: &'static str,
    ls2: &'static str,
    fc1: &'static str,
    fc2: &'static str,
    projector_prefixes: [&'static str; 2],
}

const VENDOR: Scheme = Scheme {
    layout: WeightLayout::Vendor,
    patch: "conv1.weight",
    pos: "positional_embedding",
    ln_pre: "ln_pre",
    down1: "vit_downsampler1",
    down2: "vit_downsampler2",
    layer: |i| format!("transformer.resblocks.{i}."),
    layer_prefix: "transformer.resblocks.",
    ln1: "ln_1",
    ln2: "ln_2",
    out: "attn.out_proj",
    ls1: "ls_1.gamma",
    ls2: "ls_2.gamma",
    fc1: "mlp.c_fc",
    fc2: "mlp.c_proj",
    projector_prefixes: VENDOR_PROJECTOR_PREFIXES,
};

const HF: Scheme = Scheme {
    layout: WeightLayout::Hf,
    patch: "embeddings.patch_embedding.weight",
    pos: "embeddings.position_embedding.weight",
    ln_pre: "pre_layernorm",
    down1: "downsampler1",
    down2: "downsampler2",
    layer: |i| format!("layers.{i}."),
    layer_prefix: "layers.",
    ln1: "layernorm_before",
    ln2: "layernorm_after",
    out: "self_attn.out_proj",
    ls1: "lambda_1",
    ls2: "lambda_2",
    fc1: "mlp.fc1",
    fc2: "mlp.fc2",
    projector_prefixes: HF_PROJECTOR_PREFIXES,
};

/// Vendor fused qkv names (relative to the layer stem).
const VENDOR_QKV: [&str; 2] = ["attn.in_proj_weight", "attn.in_proj_bias"];
/// HF split projections (relative to the layer stem), in the order of the fused rows.
const HF_QKV: [&str; 3] = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"];

/// The checkpoint seen through one scheme at its actual prefixes.
struct Names<'a> {
    scheme: &'a Scheme,
    vision: &'a str,
    projector: &'a str,
}

impl Names<'_> {
    fn v(&self, rel: &str) -> String {
        format!("{}{rel}", self.vision)
    }
    fn layer(&self, i: usize, rel: &str) -> String {
        format!("{}{}{rel}", self.vision, (self.scheme.layer)(i))
    }
    fn proj(&self, rel: &str) -> String {
        format!("{}{rel}", self.projector)
    }

    /// Every tensor name this scheme reads for `cfg`, to refuse unknown ones.
    fn known(&self, cfg: &StepConfig) -> BTreeSet<String> {
        let s = self.scheme;
        let mut set = BTreeSet::new();
        set.insert(self.v(s.patch));
        set.insert(self.v(s.pos));
        for stem in [s.ln_pre, s.down1, s.down2] {
            set.insert(self.v(&format!("{stem}.weight")));
            set.insert(self.v(&format!("{stem}.bias")));
        }
        for i in 0..cfg.layers {
            for stem in [s.ln1, s.ln2, s.out, s.fc1, s.fc2] {
                set.insert(self.layer(i, &format!("{stem}.weight")));
                set.insert(self.layer(i, &format!("{stem}.bias")));
            }
            set.insert(self.layer(i, s.ls1));
            set.insert(self.layer(i, s.ls2));
            match s.layout {
                WeightLayout::Vendor => {
                    for n in VENDOR_QKV {
                        set.insert(self.layer(i, n));
                    }
                }
                WeightLayout::Hf => {
                    for n in HF_QKV {
                        set.insert(self.layer(i, &format!("{n}.weight")));
                        set.insert(self.layer(i, &format!("{n}.bias")));
                    }
                }
            }
        }
        set.insert(self.proj("weight"));
        if cfg.projector_bias {
            set.insert(self.proj("bias"));
        }
        set
    }
}

/// How a loader turns a tensor of the file into its store (f32 values, or a mapped view).
type Read<'a, T> = dyn Fn(TensorView<'a>) -> Result<T> + 'a;

/// Reads `name` with `read`, checking its shape first.
fn get<'a, T>(ck: &'a Checkpoint, name: &str, expected: &[usize], read: &Read<'a, T>) -> Result<T> {
    let view = ck
        .tensor(name)
        .ok_or_else(|| StepError::MissingTensor(name.to_string()))?;
    if view.shape() != expected {
        return Err(StepError::Shape {
            name: name.to_string(),
            found: view.shape().to_vec(),
            expected: expected.to_vec(),
        });
    }
    read(view)
}

/// A float tensor of the memory-mapped file, read in place at upload (F32, F16, BF16); any
/// other dtype gives the reader's own refusal.
fn mapped(v: TensorView<'_>) -> Result<HostTensor<'_>> {
    let dtype = LeDtype::from_safetensors(v.dtype().as_str());
    HostTensor::in_place(v.bytes(), dtype, || Ok(v.to_f32()?))
}

/// The one prefix among `prefixes` under which the checkpoint has tensors, if any.
fn only_prefix<'p>(ck: &Checkpoint, prefixes: &[&'p str], what: &str) -> Result<Option<&'p str>> {
    let present: Vec<&str> = prefixes
        .iter()
        .copied()
        .filter(|p| ck.tensors().any(|t| t.name.starts_with(p)))
        .collect();
    match present[..] {
        [] => Ok(None),
        [one] => Ok(Some(one)),
        _ => Err(StepError::Ambiguous(format!(
            "the {what} appears under several prefixes: {present:?}"
        ))),
    }
}

/// Loads the tower from an opened checkpoint, with its `config.json` value, into host f32.
pub fn load(ck: &Checkpoint, config: &serde_json::Value) -> Result<(StepConfig, StepWeights)> {
    load_with(ck, config, &|v| Ok(v.to_f32()?))
}

/// Validates the tower like [`load`] but keeps every tensor as a view of the memory-mapped
/// file: nothing is converted until the CUDA path uploads it.
pub fn load_mapped<'a>(
    ck: &'a Checkpoint,
    config: &serde_json::Value,
) -> Result<(StepConfig, StepWeights<HostTensor<'a>>)> {
    load_with(ck, config, &mapped)
}

fn load_with<'a, T: TensorStore>(
    ck: &'a Checkpoint,
    config: &serde_json::Value,
    read: &Read<'a, T>,
) -> Result<(StepConfig, StepWeights<T>)> {
    let vision = only_prefix(ck, &VISION_PREFIXES, "vision tower")?.ok_or_else(|| {
        StepError::NoVisionWeights(format!("no tensor under {VISION_PREFIXES:?}"))
    })?;
    let vendor = ck.tensor(&format!("{vision}{}", VENDOR.patch)).is_some();
    let hf = ck.tensor(&format!("{vision}{}", HF.patch)).is_some();
    let scheme = match (vendor, hf) {
        (true, false) => &VENDOR,
        (false, true) => &HF,
        (true, true) => {
            return Err(StepError::Ambiguous(format!(
                "both {vision}{} (vendor) and {vision}{} (HF) are present",
                VENDOR.patch, HF.patch
            )))
        }
        (false, false) => {
            return Err(StepError::NoVisionWeights(format!(
                "neither {vision}{} (vendor layout) nor {vision}{} (HF layout) is present",
                VENDOR.patch, HF.patch
            )))
        }
    };
    // The projector of the other layout is refused by the census below.
    let all_projectors: Vec<&str> = VENDOR_PROJECTOR_PREFIXES
        .iter()
        .chain(&HF_PROJECTOR_PREFIXES)
        .copied()
        .collect();
    let projector = only_prefix(ck, &scheme.projector_prefixes, "projector")?.ok_or_else(|| {
        StepError::MissingTensor(format!("{}weight", scheme.projector_prefixes[0]))
    })?;
    let names = Names {
        scheme,
        vision,
        projector,
    };
    let proj_name = names.proj("weight");
    let proj_shape = ck
        .tensor(&proj_name)
        .map(|v| v.shape().to_vec())
        .ok_or_else(|| StepError::MissingTensor(proj_name.clone()))?;
    let text_hidden = match proj_shape[..] {
        [t, _] => t,
        _ => {
            return Err(StepError::Shape {
                name: proj_name,
                found: proj_shape,
                expected: vec![0, 0],
            })
        }
    };
    let cfg = StepConfig::from_hf(config, text_hidden)?;
    require_layers(ck, &names, cfg.layers)?;
    check_census(ck, &[vision], &all_projectors, &names.known(&cfg))?;
    let w = load_tensors(ck, &names, &cfg, read)?;
    Ok((cfg, w))
}

/// Refuses a configured layer count the file does not hold, before the census builds a name per
/// configured layer: the first configured layer with no tensor in the file is named by its first
/// LayerNorm weight. One pass over the file's names, whatever the count; a layer that is present
/// but incomplete is left to the census and the loader.
fn require_layers(ck: &Checkpoint, names: &Names<'_>, layers: usize) -> Result<()> {
    let stem = names.v(names.scheme.layer_prefix);
    let present: BTreeSet<usize> = ck
        .tensors()
        .filter_map(|t| {
            t.name
                .strip_prefix(stem.as_str())?
                .split('.')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    match (0..layers).find(|i| !present.contains(i)) {
        Some(i) => Err(StepError::MissingTensor(
            names.layer(i, &format!("{}.weight", names.scheme.ln1)),
        )),
        None => Ok(()),
    }
}

/// Refuses any tensor under the tower's or a projector's prefixes that the scheme does not name
/// (the LM's tensors, whatever their dtype, are outside and ignored).
fn check_census(
    ck: &Checkpoint,
    vision: &[&str],
    projectors: &[&str],
    known: &BTreeSet<String>,
) -> Result<()> {
    for t in ck.tensors() {
        let ours = vision
            .iter()
            .chain(projectors)
            .any(|p| t.name.starts_with(p));
        if ours && !known.contains(&t.name) {
            return Err(StepError::UnknownTensor(t.name.clone()));
        }
    }
    Ok(())
}

fn load_tensors<'a, T: TensorStore>(
    ck: &'a Checkpoint,
    n: &Names<'_>,
    cfg: &StepConfig,
    read: &Read<'a, T>,
) -> Result<StepWeights<T>> {
    let (h, inner, p) = (cfg.hidden, cfg.intermediate, cfg.patch);
    let s = n.scheme;
    let get = |name: &str, shape: &[usize]| get(ck, name, shape, read);
    let wb = |stem: String, out: usize, inp: &[usize]| -> Result<(T, T)> {
        let mut shape = vec![out];
        shape.extend_from_slice(inp);
        Ok((
            get(&format!("{stem}.weight"), &shape)?,
            get(&format!("{stem}.bias"), &[out])?,
        ))
    };
    let patch = get(&n.v(s.patch), &[h, NUM_CHANNELS, p, p])?;
    let pos = get(&n.v(s.pos), &[cfg.pos_rows(), h])?;
    let (ln_pre_w, ln_pre_b) = wb(n.v(s.ln_pre), h, &[])?;
    let mut layers = Vec::with_capacity(cfg.layers);
    for i in 0..cfg.layers {
        let (qkv_w, qkv_b) = match s.layout {
            WeightLayout::Vendor => (
                get(&n.layer(i, VENDOR_QKV[0]), &[3 * h, h])?,
                get(&n.layer(i, VENDOR_QKV[1]), &[3 * h])?,
            ),
            WeightLayout::Hf => {
                let (mut w, mut b) = (Vec::with_capacity(3), Vec::with_capacity(3));
                for stem in HF_QKV {
                    let (wi, bi) = wb(n.layer(i, stem), h, &[h])?;
                    w.push(wi);
                    b.push(bi);
                }
                (T::stack(w), T::stack(b))
            }
        };
        let (ln1_w, ln1_b) = wb(n.layer(i, s.ln1), h, &[])?;
        let (ln2_w, ln2_b) = wb(n.layer(i, s.ln2), h, &[])?;
        let (out_w, out_b) = wb(n.layer(i, s.out), h, &[h])?;
        let (fc1_w, fc1_b) = wb(n.layer(i, s.fc1), inner, &[h])?;
        let (fc2_w, fc2_b) = wb(n.layer(i, s.fc2), h, &[inner])?;
        layers.push(Layer {
            ln1_w,
            ln1_b,
            qkv_w,
            qkv_b,
            out_w,
            out_b,
            ls1: get(&n.layer(i, s.ls1), &[h])?,
            ln2_w,
            ln2_b,
            fc1_w,
            fc1_b,
            fc2_w,
            fc2_b,
            ls2: get(&n.layer(i, s.ls2), &[h])?,
        });
    }
    let (down1_w, down1_b) = wb(n.v(s.down1), 2 * h, &[h, 3, 3])?;
    let (down2_w, down2_b) = wb(n.v(s.down2), 4 * h, &[2 * h, 3, 3])?;
    let proj = get(&n.proj("weight"), &[cfg.text_hidden, cfg.out_width()])?;
    let proj_b = if cfg.projector_bias {
        Some(get(&n.proj("bias"), &[cfg.text_hidden])?)
    } else {
        None
    };
    Ok(StepWeights {
        layout: s.layout,
        patch,
        pos,
        ln_pre_w,
        ln_pre_b,
        layers,
        down1_w,
        down1_b,
        down2_w,
        down2_b,
        proj,
        proj_b,
    })
}
