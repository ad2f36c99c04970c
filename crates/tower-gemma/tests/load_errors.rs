//! Loading refuses what it cannot honour: a missing or misshapen tensor names itself, an
//! unknown vision tensor is refused, a text-only checkpoint says it has no vision weights.

use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use tower_gemma::{GemmaError, GemmaTower};

fn fixture_repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/gemma4")
}

/// Rewrites the fixture repo into a temp dir, letting `edit` drop, reshape or add tensors.
fn variant(
    tag: &str,
    edit: impl Fn(&str, &[usize], &[u8]) -> Vec<(String, Vec<usize>, Vec<u8>)>,
) -> PathBuf {
    let src = st_reader::Checkpoint::open(fixture_repo()).unwrap();
    let dir = std::env::temp_dir().join(format!("tower-gemma-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture_repo().join("config.json"), dir.join("config.json")).unwrap();
    let mut header = Map::new();
    let mut data = Vec::new();
    for info in src.tensors() {
        let view = src.tensor(&info.name).unwrap();
        for (name, shape, bytes) in edit(&info.name, view.shape(), view.bytes()) {
            let begin = data.len();
            data.extend_from_slice(&bytes);
            header.insert(
                name,
                json!({"dtype": "BF16", "shape": shape, "data_offsets": [begin, data.len()]}),
            );
        }
    }
    let mut h = Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut file = (h.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&h);
    file.extend_from_slice(&data);
    std::fs::write(dir.join("model.safetensors"), file).unwrap();
    dir
}

fn open(dir: &Path) -> Result<GemmaTower, GemmaError> {
    GemmaTower::from_checkpoint(&st_reader::Checkpoint::open(dir).unwrap())
}

const K_PROJ: &str = "model.vision_tower.encoder.layers.1.self_attn.k_proj.linear.weight";

#[test]
fn the_fixture_itself_loads() {
    let t = open(&fixture_repo()).unwrap();
    assert_eq!(
        (
            t.config.hidden,
            t.config.heads,
            t.config.head_dim,
            t.config.layers
        ),
        (72, 3, 24, 2)
    );
}

#[test]
fn a_missing_tensor_is_named() {
    let dir = variant("missing", |n, s, b| {
        if n == K_PROJ {
            vec![]
        } else {
            vec![(n.into(), s.to_vec(), b.to_vec())]
        }
    });
    match open(&dir) {
        Err(GemmaError::MissingTensor(name)) => assert_eq!(name, K_PROJ),
        other => panic!("expected MissingTensor, got {other:?}"),
    }
}

#[test]
fn a_misshapen_tensor_is_named_with_both_shapes() {
    let q_norm = "model.vision_tower.encoder.layers.0.self_attn.q_norm.weight";
    let dir = variant("shape", |n, s, b| {
        let shape = if n == q_norm {
            vec![2, s[0] / 2]
        } else {
            s.to_vec()
        };
        vec![(n.into(), shape, b.to_vec())]
    });
    match open(&dir) {
        Err(GemmaError::Shape {
            name,
            found,
            expected,
        }) => {
            assert_eq!(name, q_norm);
            assert_eq!((found, expected), (vec![2, 12], vec![24]));
        }
        other => panic!("expected Shape, got {other:?}"),
    }
}

#[test]
fn an_unknown_vision_tensor_is_refused() {
    let extra = "model.vision_tower.encoder.layers.0.out_scale.weight";
    let dir = variant("unknown", |n, s, b| {
        let mut v = vec![(n.to_string(), s.to_vec(), b.to_vec())];
        if n == K_PROJ {
            v.push((extra.to_string(), vec![1], vec![0, 0]));
        }
        v
    });
    match open(&dir) {
        Err(GemmaError::UnknownTensor(name)) => assert_eq!(name, extra),
        other => panic!("expected UnknownTensor, got {other:?}"),
    }
}

#[test]
fn a_text_only_checkpoint_has_no_vision_weights() {
    let dir = variant("text-only", |n, s, b| {
        if n.starts_with("model.vision_tower.") || n.starts_with("model.embed_vision.") {
            vec![]
        } else {
            vec![(n.into(), s.to_vec(), b.to_vec())]
        }
    });
    assert!(
        matches!(open(&dir), Err(GemmaError::NoVisionWeights(_))),
        "{:?}",
        open(&dir)
    );
}

/// A position outside i32 is refused, not truncated onto a valid grid cell (2³² would wrap to 0
/// and pass the raster check).
#[test]
fn a_position_outside_i32_is_refused() {
    let t = open(&fixture_repo()).unwrap();
    let (gw, gh) = (3usize, 3usize);
    let patches = vec![0.5f32; gw * gh * t.config.patch_dim()];
    let mut positions: Vec<i64> = (0..gw * gh)
        .flat_map(|i| [(i % gw) as i64, (i / gw) as i64])
        .collect();
    assert!(t
        .encode_host(&[tower_gemma::GemmaImage {
            patches: &patches,
            positions: &positions
        }])
        .is_ok());
    positions[0] += 1 << 32;
    let image = tower_gemma::GemmaImage {
        patches: &patches,
        positions: &positions,
    };
    assert!(matches!(t.encode_host(&[image]), Err(GemmaError::Input(_))));
}

/// A configured layer count the file does not hold is refused before the census builds a name
/// per layer: one layer too many is the first absent layer, named; a count over the bound is a
/// config error (10⁶ used to build 10⁷ names first).
#[test]
fn a_layer_count_beyond_the_file_is_refused_before_anything_is_built() {
    let dir = variant("layers", |n, s, b| vec![(n.into(), s.to_vec(), b.to_vec())]);
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let with_layers = |n: u64| {
        let mut c = config.clone();
        c["vision_config"]["num_hidden_layers"] = json!(n);
        std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
        open(&dir)
    };
    match with_layers(3) {
        Err(GemmaError::MissingTensor(name)) => assert_eq!(
            name,
            "model.vision_tower.encoder.layers.2.input_layernorm.weight"
        ),
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    for n in [1_000_000, 1 << 40] {
        let got = with_layers(n);
        assert!(matches!(got, Err(GemmaError::Config(_))), "{n}: {got:?}");
    }
}
