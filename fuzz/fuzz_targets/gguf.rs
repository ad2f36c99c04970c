#![no_main]
// Parse arbitrary bytes as GGUF; on success convert every tensor both ways. Must never panic.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(file) = gguf_reader::GgufFile::from_bytes(data.to_vec()) {
        for t in file.tensors() {
            let _ = (file.to_f32(t), file.to_bf16(t));
        }
    }
});
