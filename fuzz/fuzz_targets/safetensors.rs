#![no_main]
//! Parses arbitrary bytes as one safetensors file and converts every tensor.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(ckpt) = st_reader::Checkpoint::from_bytes(data.to_vec()) {
        for view in ckpt.tensors().filter_map(|t| ckpt.tensor(&t.name)) {
            let _ = (view.to_f32(), view.to_bf16(), ckpt.find(view.name()));
        }
    }
});
