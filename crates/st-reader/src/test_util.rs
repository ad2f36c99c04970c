//! Shared test helpers: fixture paths, the writer's expected values, scratch directories.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// `fixtures/readers/safetensors/` (written by `fixtures/readers/make_safetensors.py`).
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/readers/safetensors")
}

/// The writer's `expected.json` sidecar.
pub fn expected() -> Value {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("expected.json parses")
}

/// The expected entry of fixture file `rel`.
pub fn expected_file(rel: &str) -> Value {
    expected()["files"][rel].clone()
}

/// Splits a safetensors file into its header text and data buffer.
pub fn split(bytes: &[u8]) -> (String, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    (header, bytes[8 + n..].to_vec())
}

/// Assembles a safetensors file from raw header bytes and a data buffer.
pub fn assemble(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

/// Decodes a lowercase hex string.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// A fresh empty directory unique to this test.
    pub fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("st-reader-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// A scratch copy of fixture directory `rel`.
    pub fn copy_of(rel: &str, tag: &str) -> Scratch {
        let s = Scratch::new(tag);
        for entry in std::fs::read_dir(fixtures().join(rel)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), s.0.join(entry.file_name())).unwrap();
        }
        s
    }

    /// Path of `name` inside the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
