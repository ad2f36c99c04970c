//! Which model family a weight file belongs to.

use crate::weights::WeightFile;
use serde_json::Value;
pub use vision_prep::Family;

/// llama.cpp mmproj: `clip.vision.projector_type` (or the older `clip.projector_type`) names the
/// projector; `gemma4v` is Gemma-4's (convert_hf_to_gguf.py, Gemma4 vision model).
const GGUF_PROJECTOR_KEYS: [&str; 2] = ["clip.vision.projector_type", "clip.projector_type"];

/// The family a llama.cpp projector type names, if it is one of ours.
pub fn family_from_gguf_projector(projector: &str) -> Option<Family> {
    match projector {
        "gemma4v" => Some(Family::Gemma4),
        _ => None,
    }
}

/// The family a transformers `config.json` `model_type` names (the whole model's, or the
/// vision config's), if it is one of ours.
pub fn family_from_model_type(model_type: &str) -> Option<Family> {
    match model_type {
        "gemma4" | "gemma4_vision" => Some(Family::Gemma4),
        "glm5_next" | "glm5_next_vision" => Some(Family::Glm5Next),
        "glm_ocr" | "glm_ocr_vision" => Some(Family::GlmOcr),
        "step3p7" | "step3p5_vision" | "step3p7_vision" => Some(Family::Step3p7),
        _ => None,
    }
}

/// Detects the family of an opened weight file: GGUF by its projector type, safetensors by
/// `config.json` `model_type`, failing that by the tensor census.
pub fn detect_family(file: &WeightFile) -> Option<Family> {
    match file {
        WeightFile::Gguf(g) => GGUF_PROJECTOR_KEYS
            .iter()
            .find_map(|k| g.get(k).and_then(|v| v.as_str()))
            .and_then(family_from_gguf_projector),
        WeightFile::SafeTensors(st) => st
            .config()
            .and_then(family_from_config)
            .or_else(|| family_from_census(st.tensors().map(|t| (t.name.as_str(), &t.shape[..])))),
    }
}

fn family_from_config(config: &Value) -> Option<Family> {
    let top = config.get("model_type").and_then(Value::as_str);
    let vision = config
        .get("vision_config")
        .and_then(|v| v.get("model_type"))
        .and_then(Value::as_str);
    top.and_then(family_from_model_type)
        .or_else(|| vision.and_then(family_from_model_type))
}

/// The tensor census, for checkpoints without a usable `config.json`. Each family is known by a
/// tensor only it has, under any of the prefixes real checkpoints use.
fn family_from_census<'a>(tensors: impl Iterator<Item = (&'a str, &'a [usize])>) -> Option<Family> {
    let mut glm_merger: Option<(usize, usize)> = None;
    let mut glm = false;
    for (name, shape) in tensors {
        let name = name.strip_prefix("model.").unwrap_or(name);
        if name.starts_with("vision_tower.patch_embedder.") || name.starts_with("embed_vision.") {
            return Some(Family::Gemma4);
        }
        if name.starts_with("vision_model.conv1.")
            || name.starts_with("vision_model.embeddings.patch_embedding.")
            || name.starts_with("vit_large_projector.")
        {
            return Some(Family::Step3p7);
        }
        if name.starts_with("visual.blocks.") {
            glm = true;
        }
        if name == "visual.merger.gate_proj.weight" {
            if let [inner, width] = shape {
                glm_merger = Some((*inner, *width));
            }
        }
    }
    if !glm {
        return None;
    }
    // GLM-OCR's merger inner width is 3 × its output width (modeling_glm_ocr.py: context_dim =
    // out_hidden_size · in_channels); glm5_next's is its own projection_intermediate_size.
    match glm_merger {
        Some((inner, width)) if inner == 3 * width => Some(Family::GlmOcr),
        _ => Some(Family::Glm5Next),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn census_tells_glm_ocr_from_glm5_next_by_merger_width() {
        let ocr = [
            ("model.visual.blocks.0.attn.qkv.weight", &[192usize, 64][..]),
            ("model.visual.merger.gate_proj.weight", &[144, 48][..]),
        ];
        assert_eq!(family_from_census(ocr.into_iter()), Some(Family::GlmOcr));
        let next = [
            ("model.visual.blocks.0.attn.qkv.weight", &[192usize, 64][..]),
            ("model.visual.merger.gate_proj.weight", &[80, 48][..]),
        ];
        assert_eq!(family_from_census(next.into_iter()), Some(Family::Glm5Next));
    }

    #[test]
    fn census_knows_step_under_both_prefixes() {
        for name in [
            "vision_model.conv1.weight",
            "model.vision_model.conv1.weight",
        ] {
            let t = [(name, &[64usize, 3, 14, 14][..])];
            assert_eq!(family_from_census(t.into_iter()), Some(Family::Step3p7));
        }
    }

    #[test]
    fn unknown_projector_is_no_family() {
        assert_eq!(family_from_gguf_projector("qwen2vl_merger"), None);
        assert_eq!(family_from_gguf_projector("gemma4v"), Some(Family::Gemma4));
    }
}
