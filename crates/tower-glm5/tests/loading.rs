//! Loading: config laws per family, and the typed answers for broken checkpoints.

mod common;

use common::{edited, fixtures};
use st_reader::Checkpoint;
use tower_glm5::{load_hf_with_config, GlmError, GlmFamily, GlmTower, LmAttention};

#[test]
fn both_fixture_repos_load_with_their_family_laws() {
    let ck = Checkpoint::open(fixtures().join("models/glm5_next")).expect("open");
    let t = GlmTower::from_checkpoint(&ck).expect("glm5_next loads");
    let c = t.config();
    assert_eq!(c.family, GlmFamily::Glm5Next);
    assert_eq!((c.hidden, c.heads, c.head_dim, c.layers), (64, 4, 16, 2));
    assert_eq!((c.intermediate, c.text_hidden), (96, 48));
    // projection_intermediate_size from the config
    assert_eq!(c.merger_inner, 80);
    assert_eq!(c.swiglu_limit, Some(1.3359375));
    assert_eq!(c.patch_dim(), 1176);
    assert_eq!(c.rope_theta, 10000.0);
    assert_eq!(t.lm_attention(), LmAttention::Causal);

    let ck = Checkpoint::open(fixtures().join("models/glm_ocr")).expect("open");
    let t = GlmTower::from_checkpoint(&ck).expect("glm_ocr loads");
    let c = t.config();
    assert_eq!(c.family, GlmFamily::GlmOcr);
    // merger context_dim = out_hidden_size · in_channels (modeling_glm_ocr.py:575), unclamped
    assert_eq!(c.merger_inner, 3 * 48);
    assert_eq!(c.swiglu_limit, None);
    assert_eq!(t.lm_attention(), LmAttention::Causal);
}

#[test]
fn text_only_release_is_no_vision_weights() {
    for variant in ["glm5_next", "glm_ocr"] {
        let (ck, config) = edited(variant, |e| e.retain(|t| !t.name.contains("visual.")));
        assert!(!ck.is_empty(), "the LM tensors remain");
        match load_hf_with_config(&ck, &config) {
            Err(GlmError::NoVisionWeights(m)) => {
                assert!(m.contains("model.visual.patch_embed.proj.weight"), "{m}")
            }
            other => panic!("{variant}: expected NoVisionWeights, got {other:?}"),
        }
        // Without any config at all the probe still answers first.
        assert!(matches!(
            GlmTower::from_checkpoint(&ck),
            Err(GlmError::NoVisionWeights(_))
        ));
    }
}

#[test]
fn missing_tensor_is_named() {
    for name in [
        "model.visual.blocks.1.attn.k_norm.weight",
        "model.visual.blocks.0.mlp.up_proj.bias",
        "model.visual.merger.post_projection_norm.bias",
        "model.visual.downsample.bias",
    ] {
        let (ck, config) = edited("glm5_next", |e| e.retain(|t| t.name != name));
        match load_hf_with_config(&ck, &config) {
            Err(GlmError::MissingTensor(n)) => assert_eq!(n, name),
            other => panic!("dropping {name}: expected MissingTensor, got {other:?}"),
        }
    }
}

#[test]
fn misshapen_tensor_is_named_with_both_shapes() {
    let name = "model.visual.blocks.0.attn.qkv.weight";
    let (ck, config) = edited("glm_ocr", |e| {
        for t in e.iter_mut().filter(|t| t.name == name) {
            t.shape = vec![64, 192];
        }
    });
    match load_hf_with_config(&ck, &config) {
        Err(GlmError::Shape {
            name: n,
            found,
            expected,
        }) => {
            assert_eq!(n, name);
            assert_eq!(found, vec![64, 192]);
            assert_eq!(expected, vec![192, 64]);
        }
        other => panic!("expected Shape, got {other:?}"),
    }
}

#[test]
fn merger_width_is_checked_against_the_census() {
    // A glm5_next config whose projection_intermediate_size disagrees with the weights.
    let (ck, mut config) = edited("glm5_next", |_| {});
    config["vision_config"]["projection_intermediate_size"] = 96.into();
    match load_hf_with_config(&ck, &config) {
        Err(GlmError::Shape {
            name,
            found,
            expected,
        }) => {
            assert_eq!(name, "model.visual.merger.gate_proj.weight");
            assert_eq!((found, expected), (vec![80, 48], vec![96, 48]));
        }
        other => panic!("expected Shape, got {other:?}"),
    }
    // The glm_ocr weights under a glm5_next config: merger 144 wide, not the default 10240.
    let (ck, mut config) = edited("glm_ocr", |_| {});
    config["model_type"] = "glm5_next".into();
    config["vision_config"]["model_type"] = "glm5_next_vision".into();
    assert!(matches!(
        load_hf_with_config(&ck, &config),
        Err(GlmError::Shape { .. })
    ));
}

#[test]
fn unknown_vision_tensors_are_refused() {
    // An extra tensor in a known block, and a whole block beyond `depth`.
    for extra in [
        "model.visual.blocks.0.attn.rel_pos.weight",
        "model.visual.blocks.2.norm1.weight",
        "model.visual.embeddings.position_embedding.weight",
    ] {
        let (ck, config) = edited("glm_ocr", |e| {
            let mut t = e
                .iter()
                .find(|t| t.name == "model.visual.blocks.0.norm1.weight")
                .cloned()
                .expect("norm1");
            t.name = extra.to_string();
            e.push(t);
        });
        match load_hf_with_config(&ck, &config) {
            Err(GlmError::UnknownTensor(n)) => assert_eq!(n, extra),
            other => panic!("{extra}: expected UnknownTensor, got {other:?}"),
        }
    }
}

#[test]
fn model_prefix_may_be_dropped() {
    let (ck, config) = edited("glm5_next", |e| {
        for t in e.iter_mut() {
            if let Some(rest) = t.name.strip_prefix("model.") {
                t.name = rest.to_string();
            }
        }
    });
    let (cfg, w) = load_hf_with_config(&ck, &config).expect("visual.* loads");
    assert_eq!(w.blocks.len(), cfg.layers);
}

#[test]
fn config_errors_are_typed() {
    let (ck, config) = edited("glm5_next", |_| {});
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: [(&str, Edit); 10] = [
        (
            "no vision_config",
            Box::new(|c| {
                c.as_object_mut().unwrap().remove("vision_config");
            }),
        ),
        (
            "foreign model_type",
            Box::new(|c| {
                c["model_type"] = "qwen2_vl".into();
                c["vision_config"]["model_type"] = "qwen2_vl".into();
            }),
        ),
        (
            "families disagree",
            Box::new(|c| c["model_type"] = "glm_ocr".into()),
        ),
        (
            "non-axial rope",
            Box::new(|c| c["vision_config"]["rope_parameters"]["rope_type"] = "default".into()),
        ),
        (
            "heads do not divide",
            Box::new(|c| c["vision_config"]["num_heads"] = 3.into()),
        ),
        (
            "hostile width",
            Box::new(|c| c["vision_config"]["hidden_size"] = (u64::MAX / 2).into()),
        ),
        (
            "hostile patch",
            Box::new(|c| c["vision_config"]["patch_size"] = (1u64 << 19).into()),
        ),
        (
            "depth 10^6 (under MAX_DIMENSION)",
            Box::new(|c| c["vision_config"]["depth"] = 1_000_000.into()),
        ),
        (
            "depth over MAX_LAYERS",
            Box::new(|c| c["vision_config"]["depth"] = (tower_glm5::MAX_LAYERS + 1).into()),
        ),
        (
            "negative limit",
            Box::new(|c| c["vision_config"]["swiglu_limit"] = (-1.0).into()),
        ),
    ];
    for (what, edit) in cases {
        let mut c = config.clone();
        edit(&mut c);
        match load_hf_with_config(&ck, &c) {
            Err(GlmError::Config(_)) => {}
            other => panic!("{what}: expected Config, got {other:?}"),
        }
    }
    // θ is a config key (default 10000 when rope_parameters omits it).
    let mut c = config.clone();
    c["vision_config"]["rope_parameters"] =
        serde_json::json!({"rope_type": "axial", "rope_theta": 500.0});
    assert_eq!(
        load_hf_with_config(&ck, &c).expect("loads").0.rope_theta,
        500.0
    );
    c["vision_config"]["rope_parameters"] = serde_json::json!({"rope_type": "axial"});
    assert_eq!(
        load_hf_with_config(&ck, &c).expect("loads").0.rope_theta,
        10000.0
    );
    // The fixture config states depth 2; a config saying 3 (or the bound) finds blocks.2
    // missing, by name, before the census builds a name per configured block.
    for depth in [3, tower_glm5::MAX_LAYERS] {
        let mut c = config.clone();
        c["vision_config"]["depth"] = depth.into();
        assert!(matches!(
            load_hf_with_config(&ck, &c),
            Err(GlmError::MissingTensor(n)) if n == "model.visual.blocks.2.norm1.weight"
        ));
    }
}

/// The CUDA path's loader (views of the memory-mapped file) reads every tensor as the host
/// loader's f32 values.
#[test]
fn mapped_weights_read_the_values_of_the_f32_load() {
    use gpu_core::HostSource;
    for dir in ["models/glm5_next", "models/glm_ocr"] {
        let ck = Checkpoint::open(fixtures().join(dir)).expect("open");
        let (c1, host) = tower_glm5::load_hf(&ck).expect("f32 load");
        let (c2, mapped) = tower_glm5::load_hf_mapped(&ck).expect("mapped load");
        assert_eq!(format!("{c1:?}"), format!("{c2:?}"));
        let eq = |what: &str, a: &Vec<f32>, b: &dyn HostSource| {
            assert_eq!(*a, b.to_f32_vec(), "{dir}: {what}");
        };
        eq("patch", &host.patch.w, &mapped.patch.w);
        eq("downsample", &host.downsample.w, &mapped.downsample.w);
        eq("merger_down", &host.merger_down.w, &mapped.merger_down.w);
        eq("merger_norm_b", &host.merger_norm_b, &mapped.merger_norm_b);
        for (i, (h, m)) in host.blocks.iter().zip(&mapped.blocks).enumerate() {
            eq(&format!("block {i} qkv"), &h.qkv.w, &m.qkv.w);
            eq(&format!("block {i} up"), &h.up.w, &m.up.w);
            eq(&format!("block {i} k_norm"), &h.k_norm, &m.k_norm);
            match (&h.qkv.b, &m.qkv.b) {
                (Some(a), Some(b)) => eq(&format!("block {i} qkv bias"), a, b),
                (None, None) => {}
                _ => panic!("{dir}: block {i} qkv bias presence differs"),
            }
        }
    }
}
