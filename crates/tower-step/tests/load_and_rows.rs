//! Loading errors, layout equivalence and the oracle's rows, on the committed fixtures.

use serde_json::{json, Value};
use st_reader::Checkpoint;
use std::path::PathBuf;
use tower_step::{
    LmAttention, StepError, StepImage, StepProcessorOutput, StepTower, StepView, WeightLayout,
};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn open(dir: &str) -> Checkpoint {
    Checkpoint::open(fixtures().join("models").join(dir)).expect("fixture checkpoint opens")
}

fn config(ck: &Checkpoint) -> Value {
    ck.config().expect("fixture has config.json").clone()
}

/// Rewrites a checkpoint in memory: `edit(name, shape, bytes)` returns the tensor to write
/// instead (`None` drops it).
fn rebuild(
    ck: &Checkpoint,
    edit: impl Fn(&str, &[usize], &[u8]) -> Option<(String, Vec<usize>, Vec<u8>)>,
) -> Checkpoint {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for t in ck.tensors() {
        let view = ck.tensor(&t.name).expect("listed tensor");
        let Some((name, shape, bytes)) = edit(&t.name, view.shape(), view.bytes()) else {
            continue;
        };
        let start = data.len();
        data.extend_from_slice(&bytes);
        header.insert(
            name,
            json!({"dtype": t.dtype.as_str(), "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).expect("json");
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend(h);
    bytes.extend(data);
    Checkpoint::from_bytes(bytes).expect("rebuilt checkpoint parses")
}

fn keep(n: &str, s: &[usize], b: &[u8]) -> Option<(String, Vec<usize>, Vec<u8>)> {
    Some((n.to_string(), s.to_vec(), b.to_vec()))
}

#[test]
fn vendor_checkpoint_with_packed_lm_tensors_loads() {
    let ck = open("step3p7");
    // The fixture carries NVFP4-like LM tensors (U8 / F8_E4M3) the vision loader must skip.
    assert!(ck.tensors().any(|t| t.dtype.as_str() == "U8"));
    let tower = StepTower::from_checkpoint(&ck).unwrap();
    let c = tower.config();
    assert_eq!((c.hidden, c.layers, c.heads, c.head_dim), (64, 2, 4, 16));
    assert_eq!((c.intermediate, c.pos_side, c.text_hidden), (96, 12, 80));
    assert_eq!(tower.weights.layout, WeightLayout::Vendor);
    assert_eq!(tower.lm_attention(), LmAttention::Causal);
    let hf = StepTower::from_checkpoint(&open("step3p7_hf")).unwrap();
    assert_eq!(hf.weights.layout, WeightLayout::Hf);
    assert_eq!(hf.config, tower.config);
}

#[test]
fn missing_tensor_is_named() {
    let ck = open("step3p7");
    let gone = "vision_model.transformer.resblocks.1.ls_2.gamma";
    let ck2 = rebuild(&ck, |n, s, b| (n != gone).then(|| keep(n, s, b)).flatten());
    match StepTower::from_checkpoint_with_config(&ck2, &config(&ck)) {
        Err(StepError::MissingTensor(n)) => assert_eq!(n, gone),
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    // a missing projector is missing too, not a config problem
    let ck3 = rebuild(&ck, |n, s, b| {
        (n != "vit_large_projector.weight")
            .then(|| keep(n, s, b))
            .flatten()
    });
    assert!(matches!(
        StepTower::from_checkpoint_with_config(&ck3, &config(&ck)),
        Err(StepError::MissingTensor(_))
    ));
}

#[test]
fn misshapen_tensor_reports_found_and_expected() {
    let ck = open("step3p7");
    let name = "vision_model.transformer.resblocks.0.attn.in_proj_weight";
    // [192, 64] → [64, 192]: same bytes, wrong shape.
    let ck2 = rebuild(&ck, |n, s, b| {
        let s = if n == name {
            vec![s[1], s[0]]
        } else {
            s.to_vec()
        };
        Some((n.to_string(), s, b.to_vec()))
    });
    match StepTower::from_checkpoint_with_config(&ck2, &config(&ck)) {
        Err(StepError::Shape {
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
fn unknown_vision_tensor_is_refused() {
    let ck = open("step3p7");
    let extra = "vision_model.transformer.resblocks.2.ln_1.weight";
    let ck2 = rebuild(&ck, |n, s, b| {
        if n == "vision_model.transformer.resblocks.1.ln_1.weight" {
            // duplicate as a third layer the config does not have
            Some((extra.to_string(), s.to_vec(), b.to_vec()))
        } else {
            keep(n, s, b)
        }
    });
    // the renamed layer-1 norm is now missing, but the census runs first
    match StepTower::from_checkpoint_with_config(&ck2, &config(&ck)) {
        Err(StepError::UnknownTensor(n)) => assert_eq!(n, extra),
        other => panic!("expected UnknownTensor, got {other:?}"),
    }
}

#[test]
fn model_prefixed_vendor_names_load_and_double_prefixes_are_ambiguous() {
    let ck = open("step3p7");
    // the NVFP4 release spells them model.vision_model.* / model.vit_large_projector.weight
    let ck2 = rebuild(&ck, |n, s, b| {
        let n = if n.starts_with("vision_model.") || n.starts_with("vit_large_projector.") {
            format!("model.{n}")
        } else {
            n.to_string()
        };
        Some((n, s.to_vec(), b.to_vec()))
    });
    let t = StepTower::from_checkpoint_with_config(&ck2, &config(&ck)).unwrap();
    assert_eq!(t.weights.layout, WeightLayout::Vendor);
    let ck3 = rebuild(&ck, |n, s, b| {
        let n = if n == "vision_model.ln_pre.bias" {
            format!("model.{n}")
        } else {
            n.to_string()
        };
        Some((n, s.to_vec(), b.to_vec()))
    });
    assert!(matches!(
        StepTower::from_checkpoint_with_config(&ck3, &config(&ck)),
        Err(StepError::Ambiguous(_))
    ));
}

/// Deterministic pseudo-random pixels in [-2, 2].
fn pixels(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    gpu_core::host::rel_l2(a, b)
}

fn view(pixels: &[f32], side: usize) -> StepView<'_> {
    StepView {
        pixels,
        height: side,
        width: side,
    }
}

#[test]
fn vendor_sharded_and_hf_layouts_give_the_same_rows() {
    let g0 = pixels(3 * 168 * 168, 1);
    let g1 = pixels(3 * 168 * 168, 2);
    let crops: Vec<Vec<f32>> = (0..3).map(|i| pixels(3 * 112 * 112, 10 + i)).collect();
    let images = || {
        vec![
            StepImage {
                crops: crops.iter().map(|c| view(c, 112)).collect(),
                global: view(&g0, 168),
                newline_mask: vec![false, true, false],
            },
            StepImage {
                crops: vec![],
                global: view(&g1, 168),
                newline_mask: vec![],
            },
        ]
    };
    let run = |dir: &str| {
        StepTower::from_checkpoint(&open(dir))
            .unwrap()
            .encode_host(&images())
            .unwrap()
    };
    let (v, s, h) = (run("step3p7"), run("step3p7_sharded"), run("step3p7_hf"));
    assert_eq!(v.len(), 2);
    // 112-pixel crops: grid 8 → 4 → 2 = 4 rows; 168-pixel global: 12 → 6 → 3 = 9 rows.
    assert_eq!(v[0].crop_rows, vec![4, 4, 4]);
    assert_eq!((v[0].global_rows, v[1].global_rows), (9, 9));
    assert_eq!(v[0].rows.len(), (3 * 4 + 9) * 80);
    assert_eq!(v[0].newline_mask, vec![false, true, false]);
    for i in 0..2 {
        assert_eq!(v[i].rows, s[i].rows, "sharded = vendor bit for bit");
        let r = rel(&h[i].rows, &v[i].rows);
        assert!(r < 1e-6, "image {i}: HF layout vs vendor rel-L2 {r}");
        assert_eq!(h[i].crop_rows, v[i].crop_rows);
    }
    // One pass over both images = each image alone (one attention segment per view).
    let tower = StepTower::from_checkpoint(&open("step3p7")).unwrap();
    let all = images();
    let alone = tower.encode_host(&all[1..]).unwrap();
    assert_eq!(alone[0].rows, v[1].rows);
}

/// Reads a fixture tensor's raw bytes as f32 / i64 / bool.
fn raw<'a>(ck: &'a Checkpoint, name: &str) -> (&'a [u8], Vec<usize>) {
    let t = ck
        .tensor(name)
        .unwrap_or_else(|| panic!("fixture tensor {name}"));
    (t.bytes(), t.shape().to_vec())
}

#[test]
fn batch2_rows_match_the_oracle() {
    let case = Checkpoint::open(fixtures().join("outputs/step3p7/batch2.safetensors")).unwrap();
    let f32s = |name: &str| -> (Vec<f32>, Vec<usize>) {
        let (b, s) = raw(&case, name);
        (
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            s,
        )
    };
    let (pv, pv_shape) = f32s("pixel_values");
    let (local, local_shape) = f32s("pixel_values_local");
    let nlp: Vec<usize> = raw(&case, "num_local_patches")
        .0
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as usize)
        .collect();
    let masks: Vec<bool> = raw(&case, "patch_newline_masks")
        .0
        .iter()
        .map(|&b| b != 0)
        .collect();
    let (want, _) = f32s("f32/rows");
    let batch = StepProcessorOutput {
        pixel_values: &pv,
        side: pv_shape[2],
        pixel_values_local: &local,
        local_side: local_shape[2],
        num_local_patches: &nlp,
        patch_newline_masks: Some(&masks),
    };
    let images = batch.images().unwrap();
    for dir in ["step3p7", "step3p7_hf"] {
        let tower = StepTower::from_checkpoint(&open(dir)).unwrap();
        let out = tower.encode_host(&images).unwrap();
        let got: Vec<f32> = out.iter().flat_map(|r| r.rows.iter().copied()).collect();
        // upstream f32 forward vs this f64-accumulating reference: fixture f32_vs_f64 is 8.7e-7
        let r = rel(&got, &want);
        assert!(r < 1e-5, "{dir}: rows rel-L2 vs upstream f32 {r}");
        assert_eq!(out[0].newline_mask, masks[..nlp[0]].to_vec());
    }
}

#[test]
fn inconsistent_inputs_are_input_errors() {
    let tower = StepTower::from_checkpoint(&open("step3p7")).unwrap();
    let g = vec![0.0f32; 3 * 168 * 168];
    let short = StepImage {
        crops: vec![],
        global: StepView {
            pixels: &g[1..],
            height: 168,
            width: 168,
        },
        newline_mask: vec![],
    };
    assert!(matches!(
        tower.encode_host(&[short]),
        Err(StepError::Input(_))
    ));
    let tiny = StepImage {
        crops: vec![],
        global: StepView {
            pixels: &g[..3 * 13 * 13],
            height: 13,
            width: 13,
        },
        newline_mask: vec![],
    };
    assert!(matches!(
        tower.encode_host(&[tiny]),
        Err(StepError::Input(_))
    ));
    let mask = StepImage {
        crops: vec![],
        global: StepView {
            pixels: &g,
            height: 168,
            width: 168,
        },
        newline_mask: vec![true],
    };
    assert!(matches!(
        tower.encode_host(&[mask]),
        Err(StepError::Input(_))
    ));
    let batch = StepProcessorOutput {
        pixel_values: &g,
        side: 168,
        pixel_values_local: &[],
        local_side: 112,
        num_local_patches: &[1],
        patch_newline_masks: None,
    };
    assert!(matches!(batch.images(), Err(StepError::Input(_))));
    // Fuzz finding (fuzz/fuzz_targets/inputs.rs): no tiles on file but a huge tile count must be
    // refused before the count sizes an allocation (2^40 crop views = 32 TiB).
    let huge = StepProcessorOutput {
        pixel_values: &g,
        side: 168,
        pixel_values_local: &[],
        local_side: 0,
        num_local_patches: &[1 << 40],
        patch_newline_masks: None,
    };
    assert!(matches!(huge.images(), Err(StepError::Input(_))));
}

#[test]
fn the_rope_pairing_must_match_the_layout() {
    // Guards the equivalence test: vendor q/k rows under the HF (NeoX) pairing are wrong.
    let g = pixels(3 * 168 * 168, 3);
    let img = || StepImage {
        crops: vec![],
        global: view(&g, 168),
        newline_mask: vec![],
    };
    let mut tower = StepTower::from_checkpoint(&open("step3p7")).unwrap();
    let right = tower.encode_host(&[img()]).unwrap();
    tower.weights.layout = WeightLayout::Hf;
    let wrong = tower.encode_host(&[img()]).unwrap();
    let r = rel(&wrong[0].rows, &right[0].rows);
    assert!(r > 1e-3, "rope pairing made no difference: {r}");
}

#[test]
fn hf_layout_missing_split_projection_is_named() {
    let ck = open("step3p7_hf");
    let gone = "model.vision_model.layers.0.self_attn.k_proj.bias";
    let ck2 = rebuild(&ck, |n, s, b| (n != gone).then(|| keep(n, s, b)).flatten());
    match StepTower::from_checkpoint_with_config(&ck2, &config(&ck)) {
        Err(StepError::MissingTensor(n)) => assert_eq!(n, gone),
        other => panic!("expected MissingTensor, got {other:?}"),
    }
}

/// A configured layer count the file does not hold is refused before the census builds a name
/// per layer (both layouts): one too many names the first absent layer; a count over the bound
/// is a config error (10⁶ used to build 2·10⁷ names first).
#[test]
fn a_layer_count_beyond_the_file_is_refused_before_anything_is_built() {
    for (dir, first_absent) in [
        (
            "step3p7",
            "vision_model.transformer.resblocks.2.ln_1.weight",
        ),
        (
            "step3p7_hf",
            "model.vision_model.layers.2.layernorm_before.weight",
        ),
    ] {
        let ck = open(dir);
        let with_layers = |n: u64| {
            let mut c = config(&ck);
            c["vision_config"]["num_hidden_layers"] = json!(n);
            if let Some(v) = c["vision_config"].as_object_mut() {
                v.remove("layers");
            }
            StepTower::from_checkpoint_with_config(&ck, &c)
        };
        match with_layers(3) {
            Err(StepError::MissingTensor(n)) => assert_eq!(n, first_absent, "{dir}"),
            other => panic!("{dir}: expected MissingTensor, got {other:?}"),
        }
        for n in [1_000_000, 1 << 40] {
            let got = with_layers(n);
            assert!(
                matches!(got, Err(StepError::Config(_))),
                "{dir} {n}: {got:?}"
            );
        }
    }
}

/// The CUDA path's loader (views of the memory-mapped file) reads every tensor as the host
/// loader's f32 values, on the vendor, sharded and HF layouts (HF: q, k, v stacked).
#[test]
fn mapped_weights_read_the_values_of_the_f32_load() {
    use gpu_core::HostSource;
    for dir in ["step3p7", "step3p7_sharded", "step3p7_hf"] {
        let ck = open(dir);
        let cfg = config(&ck);
        let (c1, host) = tower_step::load(&ck, &cfg).expect("f32 load");
        let (c2, mapped) = tower_step::load_mapped(&ck, &cfg).expect("mapped load");
        assert_eq!(c1, c2, "{dir}");
        assert_eq!(host.layout, mapped.layout, "{dir}");
        let same = |what: &str, a: &Vec<f32>, b: &dyn HostSource| {
            assert_eq!(*a, b.to_f32_vec(), "{dir}: {what}");
        };
        same("patch", &host.patch, &mapped.patch);
        same("pos", &host.pos, &mapped.pos);
        same("down2_w", &host.down2_w, &mapped.down2_w);
        same("proj", &host.proj, &mapped.proj);
        for (i, (h, m)) in host.layers.iter().zip(&mapped.layers).enumerate() {
            same(&format!("layer {i} qkv_w"), &h.qkv_w, &m.qkv_w);
            same(&format!("layer {i} qkv_b"), &h.qkv_b, &m.qkv_b);
            same(&format!("layer {i} fc2_w"), &h.fc2_w, &m.fc2_w);
            same(&format!("layer {i} ls1"), &h.ls1, &m.ls1);
        }
    }
}
