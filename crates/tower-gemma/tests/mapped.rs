//! The CUDA path's loaders (views of the memory-mapped file) read every tensor as the host
//! loaders' f32 values, from HF safetensors and from mmproj GGUF files (BF16, F16, clipped).

use gpu_core::HostSource;
use std::path::{Path, PathBuf};
use tower_gemma::{GemmaWeights, GgufActivation};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models")
}

fn same(what: &str, host: &GemmaWeights, mapped: &GemmaWeights<gpu_core::HostTensor<'_>>) {
    let eq = |name: &str, a: &Vec<f32>, b: &dyn HostSource| {
        assert_eq!(*a, b.to_f32_vec(), "{what}: {name}");
    };
    eq("patch", &host.patch, &mapped.patch);
    eq("pos", &host.pos, &mapped.pos);
    eq("proj", &host.proj, &mapped.proj);
    assert_eq!(host.layers.len(), mapped.layers.len());
    for (i, (h, m)) in host.layers.iter().zip(&mapped.layers).enumerate() {
        for (n, a, b) in [
            ("q", &h.q, &m.q),
            ("k", &h.k, &m.k),
            ("v", &h.v, &m.v),
            ("o", &h.o, &m.o),
            ("gate", &h.gate, &m.gate),
            ("up", &h.up, &m.up),
            ("down", &h.down, &m.down),
        ] {
            eq(&format!("layer {i} {n}"), &a.w, &b.w);
            assert_eq!((a.clamp_in, a.clamp_out), (b.clamp_in, b.clamp_out));
        }
        eq(&format!("layer {i} ln_in"), &h.ln_in, &m.ln_in);
        eq(&format!("layer {i} q_norm"), &h.q_norm, &m.q_norm);
    }
    match (&host.standardize, &mapped.standardize) {
        (Some((hb, hs)), Some((mb, ms))) => {
            eq("std_bias", hb, mb);
            eq("std_scale", hs, ms);
        }
        (None, None) => {}
        _ => panic!("{what}: standardize differs"),
    }
}

#[test]
fn mapped_hf_weights_read_the_values_of_the_f32_load() {
    for dir in ["gemma4", "gemma4_clipped"] {
        let ck = st_reader::Checkpoint::open(fixtures().join(dir)).expect("fixture");
        let (c1, host) = tower_gemma::load_hf(&ck).expect("f32 load");
        let (c2, mapped) = tower_gemma::load_hf_mapped(&ck).expect("mapped load");
        assert_eq!(format!("{c1:?}"), format!("{c2:?}"));
        same(dir, &host, &mapped);
    }
}

#[test]
fn mapped_gguf_weights_read_the_values_of_the_f32_load() {
    for file in [
        "mmproj-BF16.gguf",
        "mmproj-F16.gguf",
        "mmproj-clipped-BF16.gguf",
    ] {
        let g = gguf_reader::GgufFile::open(fixtures().join("gemma4_gguf").join(file))
            .expect("fixture");
        let (c1, host) = tower_gemma::load_gguf(&g, GgufActivation::Model).expect("f32 load");
        let (c2, mapped) =
            tower_gemma::load_gguf_mapped(&g, GgufActivation::Model).expect("mapped load");
        assert_eq!(format!("{c1:?}"), format!("{c2:?}"));
        same(file, &host, &mapped);
    }
}
