//! The one error classification (tower-core's `ErrorKind`): a wrong weight file is the weights'
//! fault, wrong prepared inputs the input's, whatever the call was doing; the C ABI's statuses and
//! Python's exception classes are read from these kinds (their own tests check the mapping).

use std::path::{Path, PathBuf};

use vision_towers::tower_core::{Classify, ErrorKind};
use vision_towers::vision_prep::PrepSettings;
use vision_towers::{Device, Model, Tower, TowerError};

fn fixtures() -> PathBuf {
    std::env::var_os("VT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"))
}

/// A copy of the glm_ocr fixture model whose first vision tensor is renamed (the header rewritten,
/// the data untouched): a file upstream would also refuse.
fn model_with_renamed_tensor(dir: &Path) -> PathBuf {
    let src = fixtures().join("models/glm_ocr");
    std::fs::create_dir_all(dir).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let name = header
        .keys()
        .find(|k| k.contains("visual") && k.ends_with(".weight"))
        .cloned()
        .expect("a vision weight");
    let value = header.remove(&name).unwrap();
    header.insert(format!("{name}_renamed"), value);
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(dir.join("model.safetensors"), out).unwrap();
    dir.to_path_buf()
}

#[test]
fn a_wrong_weight_file_is_the_weights_fault_and_wrong_inputs_the_inputs() {
    let dir = std::env::temp_dir().join(format!("vt-kinds-{}", std::process::id()));
    let bad = model_with_renamed_tensor(&dir);
    let err = Model::open(&bad, Device::Cpu, PrepSettings::default()).expect_err("renamed tensor");
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(err.kind(), ErrorKind::Weights, "{err}");
    assert!(
        matches!(
            &err,
            vision_towers::ModelError::Tower(TowerError::Refused { .. })
        ),
        "{err:?}"
    );

    // prepared inputs whose grid does not fit their rows: the input's fault
    let tower = Tower::open(&fixtures().join("models/glm_ocr"), Device::Cpu).unwrap();
    let err = tower
        .encode_prepared_file(
            &fixtures().join("adversarial/inputs/glm_ocr_grid_sum_short.safetensors"),
        )
        .expect_err("a short grid");
    assert_eq!(err.kind(), ErrorKind::Input, "{err}");
    let err = tower
        .encode_prepared_file(&fixtures().join("adversarial/inputs/not_safetensors.safetensors"))
        .expect_err("not safetensors");
    assert_eq!(err.kind(), ErrorKind::Input, "{err}");

    // a missing file is neither: the file could not be read
    let err = Tower::open(&fixtures().join("models/no-such-model"), Device::Cpu)
        .expect_err("no such model");
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    // bf16 on the CPU: valid, not available here
    let err = Tower::open_with(
        &fixtures().join("models/glm_ocr"),
        &vision_towers::TowerOptions {
            device: Device::Cpu,
            precision: Some(vision_towers::Precision::Bf16),
            ..Default::default()
        },
    )
    .expect_err("bf16 on the CPU");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
}
