//! Tests of `checkpoint.rs`.

use super::*;
use crate::test_util::{expected_file, fixtures, unhex, Scratch};
use crate::Dtype;
use serde_json::json;

/// Asserts that `ckpt` holds exactly the tensors the writer recorded for `rel`, shard `shard`.
fn check_against_writer(ckpt: &Checkpoint, rel: &str, shard: usize) {
    let exp = expected_file(rel);
    for (name, e) in exp["tensors"].as_object().unwrap() {
        let info = ckpt.info(name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(info.dtype.as_str(), e["dtype"]);
        assert_eq!(json!(info.shape), e["shape"]);
        assert_eq!(
            json!([info.data_offsets.0, info.data_offsets.1]),
            e["data_offsets"]
        );
        assert_eq!(info.shard, shard);
        assert_eq!(
            info.file_range.start,
            8 + exp["header_len"].as_u64().unwrap() as usize + info.data_offsets.0
        );
        assert_eq!(
            ckpt.tensor(name).unwrap().bytes(),
            unhex(e["raw_hex"].as_str().unwrap())
        );
    }
}

#[test]
fn single_file() {
    let path = fixtures().join("single.safetensors");
    for ckpt in [
        Checkpoint::open(&path).unwrap(),
        Checkpoint::open_in_memory(&path).unwrap(),
        Checkpoint::from_bytes(std::fs::read(&path).unwrap()).unwrap(),
    ] {
        check_against_writer(&ckpt, "single.safetensors", 0);
        let names: Vec<&str> = ckpt.tensors().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["bf16", "f16", "f32", "i64", "u8"]);
        assert_eq!(
            json!(ckpt.metadata()),
            expected_file("single.safetensors")["metadata"]
        );
        assert!(ckpt.config().is_none() && ckpt.index().is_none());
        assert_eq!(ckpt.shard_paths().len(), 1);
    }
    let ckpt = Checkpoint::open(&path).unwrap();
    assert_eq!(ckpt.root(), fixtures());
    assert_eq!(ckpt.shard_paths(), [path]);
    let mem = Checkpoint::from_bytes(std::fs::read(fixtures().join("single.safetensors")).unwrap())
        .unwrap();
    assert_eq!(mem.root(), Path::new(""));
    assert_eq!(mem.shard_paths(), [PathBuf::from(MEMORY_FILE_NAME)]);
    assert!(mem.tokenizer_json().unwrap().is_none());
}

#[test]
fn model_directory_with_configs() {
    let dir = fixtures().join("model_dir");
    let ckpt = Checkpoint::open(&dir).unwrap();
    check_against_writer(&ckpt, "model_dir/model.safetensors", 0);
    assert_eq!(ckpt.root(), dir);
    assert_eq!(ckpt.shard_paths(), [dir.join("model.safetensors")]);
    assert_eq!(ckpt.config().unwrap()["hidden_size"], 2);
    assert_eq!(ckpt.preprocessor_config().unwrap()["size"]["height"], 4);
    assert!(ckpt.processor_config().is_none() && ckpt.tokenizer_config().is_none());
    assert!(ckpt.tokenizer_json().unwrap().is_none());
    // A file path finds its directory's configs too.
    let by_file = Checkpoint::open(dir.join("model.safetensors")).unwrap();
    assert_eq!(by_file.config(), ckpt.config());
    let w = by_file
        .find("model.vision_model.embeddings.patch_embedding.weight")
        .unwrap();
    assert_eq!(w.dtype(), &Dtype::BF16);
}

#[test]
fn sharded_directory() {
    let dir = fixtures().join("sharded");
    let ckpt = Checkpoint::open(&dir).unwrap();
    let index = expected_file("sharded/model.safetensors.index.json");
    let shards = [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
    ];
    assert_eq!(ckpt.shard_paths(), shards.map(|s| dir.join(s)));
    for (i, s) in shards.iter().enumerate() {
        check_against_writer(&ckpt, &format!("sharded/{s}"), i);
    }
    let routed: BTreeMap<&str, &str> = ckpt
        .tensors()
        .map(|t| (t.name.as_str(), shards[t.shard]))
        .collect();
    assert_eq!(json!(routed), index["weight_map"]);
    assert_eq!(
        ckpt.index().unwrap()["metadata"]["total_size"],
        index["total_size"]
    );
    assert_eq!(
        ckpt.metadata().get("format").map(String::as_str),
        Some("pt")
    );
    assert_eq!(ckpt.config().unwrap()["model_type"], "tiny_vlm");
    assert_eq!(ckpt.processor_config().unwrap()["image_seq_length"], 4);
    assert_eq!(
        ckpt.tokenizer_config().unwrap()["added_tokens_decoder"]["7"]["content"],
        "<image>"
    );
    assert_eq!(
        ckpt.tokenizer_json().unwrap().unwrap()["added_tokens"][0]["id"],
        7
    );
    assert!(matches!(
        ckpt.json_file("tokenizer.json", 10),
        Err(StError::FileTooLarge { limit: 10, .. })
    ));
    assert!(matches!(
        ckpt.json_file("../config.json", 1 << 20),
        Err(StError::UnsafeFileName { .. })
    ));
    // The index file itself opens the same checkpoint.
    let via_index = Checkpoint::open(dir.join(SAFE_WEIGHTS_INDEX_NAME)).unwrap();
    assert_eq!(via_index.tensors().as_slice(), ckpt.tensors().as_slice());
    let mem = Checkpoint::open_in_memory(&dir).unwrap();
    assert_eq!(
        mem.tensor("model.language_model.norm.weight")
            .unwrap()
            .to_f32()
            .unwrap(),
        [1.0, 1.0]
    );
}

#[test]
fn find_tolerates_model_prefix() {
    let ckpt = Checkpoint::open(fixtures().join("sharded")).unwrap();
    // Stored as vision_model.*: found with and without an extra `model.`.
    for name in [
        "vision_model.encoder.layers.0.mlp.fc1.weight",
        "model.vision_model.encoder.layers.0.mlp.fc1.weight",
    ] {
        let v = ckpt.find(name).unwrap();
        assert_eq!(v.name(), "vision_model.encoder.layers.0.mlp.fc1.weight");
        assert_eq!(v.to_f32().unwrap(), [1.5, -2.0, 0.125, 3.0]);
    }
    // Stored as model.*: found without it.
    assert_eq!(
        ckpt.find("language_model.norm.weight").unwrap().name(),
        "model.language_model.norm.weight"
    );
    assert!(ckpt.tensor("language_model.norm.weight").is_none());
    match ckpt.find("vision_model.nope") {
        Err(StError::TensorNotFound { name, tried }) => {
            assert_eq!(name, "vision_model.nope");
            assert_eq!(tried, ["vision_model.nope", "model.vision_model.nope"]);
        }
        other => panic!("{other:?}"),
    }
    let v = ckpt
        .find_with_prefixes(
            &["vision_tower.", "model.vision_model.", "vision_model."],
            "embeddings.position_embedding.weight",
        )
        .unwrap();
    assert_eq!(v.to_f32().unwrap(), [0.25, -0.25, 2.0, -4.0]);
}

#[test]
fn find_refuses_ambiguous_spellings() {
    let ckpt = Checkpoint::open(fixtures().join("ambiguous.safetensors")).unwrap();
    for name in ["vision_model.head.weight", "model.vision_model.head.weight"] {
        match ckpt.find(name) {
            Err(StError::AmbiguousName { candidates, .. }) => assert_eq!(
                candidates,
                ["model.vision_model.head.weight", "vision_model.head.weight"]
            ),
            other => panic!("{other:?}"),
        }
        assert!(ckpt.tensor(name).is_some());
    }
    assert!(matches!(
        ckpt.find_with_prefixes(&["model.", ""], "vision_model.head.weight"),
        Err(StError::AmbiguousName { .. })
    ));
    assert_eq!(
        ckpt.find_with_prefixes(&["model."], "vision_model.head.weight")
            .unwrap()
            .to_f32()
            .unwrap(),
        [2.0]
    );
}

#[test]
fn directory_resolution() {
    let lone = Checkpoint::open(fixtures().join("lone_dir")).unwrap();
    assert_eq!(
        lone.shard_paths(),
        [fixtures().join("lone_dir/weights.safetensors")]
    );
    assert_eq!(lone.tensor("w").unwrap().to_f32().unwrap(), [4.0, 5.0]);
    match Checkpoint::open(fixtures().join("two_files_dir")) {
        Err(StError::AmbiguousDirectory { files, .. }) => {
            assert_eq!(files, ["a.safetensors", "b.safetensors"])
        }
        other => panic!("{other:?}"),
    }
    let empty = Scratch::new("empty");
    assert!(matches!(
        Checkpoint::open(&empty.0),
        Err(StError::NoCheckpoint { .. })
    ));
    assert!(matches!(
        Checkpoint::open(empty.path("missing")),
        Err(StError::NotFound { .. })
    ));
    std::fs::write(empty.path("tiny.safetensors"), b"abc").unwrap();
    assert!(matches!(
        Checkpoint::open(&empty.0),
        Err(StError::HeaderTooSmall { len: 3, .. })
    ));
}

#[test]
fn unknown_and_sub_byte_dtypes_are_listed() {
    let ckpt = Checkpoint::open(fixtures().join("unknown_dtype.safetensors")).unwrap();
    let q = ckpt.tensor("q").unwrap();
    assert_eq!(q.dtype(), &Dtype::Other("Q4_K_X".into()));
    assert_eq!(q.dtype().as_str(), "Q4_K_X");
    assert_eq!(q.bytes(), [1, 2, 3]);
    assert!(
        matches!(q.to_bf16(), Err(StError::UnsupportedConversion { dtype, .. }) if dtype == "Q4_K_X")
    );
    assert_eq!(ckpt.tensor("f").unwrap().to_f32().unwrap(), [1.5, -0.5]);
    // F4 [2, 3] in 3 bytes, accepted by safetensors 0.8.0's own reader (see the script).
    assert_eq!(
        expected_file("f4.safetensors")["accepted_by_safetensors"],
        true
    );
    let f4 = Checkpoint::open(fixtures().join("f4.safetensors")).unwrap();
    assert_eq!(f4.tensor("w").unwrap().dtype(), &Dtype::F4);
    assert_eq!(f4.tensor("w").unwrap().info().byte_len(), 3);
}

/// A scratch copy of the sharded fixture whose index is rewritten by `edit`.
fn sharded_with(
    tag: &str,
    edit: impl FnOnce(&mut serde_json::Map<String, Value>, &Scratch),
) -> (Scratch, Result<Checkpoint, StError>) {
    let s = Scratch::copy_of("sharded", tag);
    let path = s.path(SAFE_WEIGHTS_INDEX_NAME);
    let mut index: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(index["weight_map"].as_object_mut().unwrap(), &s);
    std::fs::write(&path, index.to_string()).unwrap();
    let r = Checkpoint::open(&s.0);
    (s, r)
}

const FC1: &str = "vision_model.encoder.layers.0.mlp.fc1.weight";
const SHARD1: &str = "model-00001-of-00003.safetensors";
const SHARD2: &str = "model-00002-of-00003.safetensors";

#[test]
fn index_routing_errors() {
    let (_s, r) = sharded_with("missing", |m, _| {
        m.insert(FC1.into(), json!("model-00009-of-00009.safetensors"));
    });
    assert!(
        matches!(r, Err(StError::MissingShard { shard, .. }) if shard == "model-00009-of-00009.safetensors")
    );
    for bad in [
        "../x",
        "/etc/passwd",
        "sub/model.safetensors",
        "a\\b",
        "..",
        ".",
        "",
    ] {
        let (_s, r) = sharded_with("unsafe", |m, _| {
            m.insert(FC1.into(), json!(bad));
        });
        assert!(
            matches!(r, Err(StError::UnsafeFileName { ref name, .. }) if name == bad),
            "{bad}: {r:?}"
        );
    }
    let (_s, r) = sharded_with("wrong", |m, _| {
        m.insert(FC1.into(), json!(SHARD1));
    });
    match r {
        Err(StError::TensorNotInShard {
            tensor,
            expected,
            found,
        }) => {
            assert_eq!(
                (tensor.as_str(), expected.as_str(), found.as_deref()),
                (FC1, SHARD1, Some(SHARD2))
            );
        }
        other => panic!("{other:?}"),
    }
    let (_s, r) = sharded_with("unlisted", |m, _| {
        m.shift_remove(FC1);
    });
    assert!(
        matches!(r, Err(StError::TensorNotInIndex { tensor, shard }) if tensor == FC1 && shard == SHARD2)
    );
    let (_s, r) = sharded_with("phantom", |m, _| {
        m.insert("vision_model.ghost".into(), json!(SHARD2));
    });
    assert!(
        matches!(r, Err(StError::TensorNotInShard { tensor, found: None, .. }) if tensor == "vision_model.ghost")
    );
    // A copy of shard 1 routed as a fourth shard: its tensors now live in two shards.
    let (_s, r) = sharded_with("twice", |m, s| {
        std::fs::copy(s.path(SHARD1), s.path("model-extra.safetensors")).unwrap();
        m.insert(
            "vision_model.embeddings.position_embedding.weight".into(),
            json!("model-extra.safetensors"),
        );
    });
    assert!(
        matches!(r, Err(StError::TensorInTwoShards { tensor, first, second })
        if tensor == "vision_model.embeddings.patch_embedding.weight" && first == "model-00001-of-00003.safetensors" && second == "model-extra.safetensors")
    );
}

#[test]
fn broken_index_and_config_files_are_named() {
    let s = Scratch::copy_of("sharded", "badindex");
    std::fs::write(s.path(SAFE_WEIGHTS_INDEX_NAME), b"{\"weight_map\": ").unwrap();
    assert!(
        matches!(Checkpoint::open(&s.0), Err(StError::InvalidJson { path, .. }) if path == s.path(SAFE_WEIGHTS_INDEX_NAME))
    );
    std::fs::write(s.path(SAFE_WEIGHTS_INDEX_NAME), b"{\"metadata\": {}}").unwrap();
    assert!(matches!(
        Checkpoint::open(&s.0),
        Err(StError::InvalidIndex { .. })
    ));
    std::fs::write(
        s.path(SAFE_WEIGHTS_INDEX_NAME),
        b"{\"weight_map\": {\"a\": 1}}",
    )
    .unwrap();
    assert!(
        matches!(Checkpoint::open(&s.0), Err(StError::InvalidIndex { reason, .. }) if reason.contains("`a`"))
    );

    let s = Scratch::copy_of("model_dir", "badconfig");
    std::fs::write(s.path("preprocessor_config.json"), b"{\"size\": 4,}").unwrap();
    assert!(
        matches!(Checkpoint::open(&s.0), Err(StError::InvalidJson { path, .. }) if path == s.path("preprocessor_config.json"))
    );
    // A broken tokenizer.json only fails when asked for.
    let s = Scratch::copy_of("model_dir", "badtok");
    std::fs::write(s.path("tokenizer.json"), b"nope").unwrap();
    let ckpt = Checkpoint::open(&s.0).unwrap();
    assert!(
        matches!(ckpt.tokenizer_json(), Err(StError::InvalidJson { path, .. }) if path == s.path("tokenizer.json"))
    );
}

#[test]
fn corrupt_shard_is_named() {
    let s = Scratch::copy_of("sharded", "corrupt");
    let path = s.path(SHARD2);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(bytes.len() - 1);
    std::fs::write(&path, bytes).unwrap();
    assert!(
        matches!(Checkpoint::open(&s.0), Err(StError::OffsetOutOfBounds { file, .. }) if file == path)
    );
}

#[test]
fn plain_file_names() {
    for ok in [
        "model.safetensors",
        "model-00001-of-00002.safetensors",
        "..x",
        "a..b",
    ] {
        assert!(is_plain_file_name(ok), "{ok}");
    }
    for bad in ["", ".", "..", "../x", "/abs", "a/b", "a\\b", "x\0y"] {
        assert!(!is_plain_file_name(bad), "{bad}");
    }
}
