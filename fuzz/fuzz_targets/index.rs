#![no_main]
//! Arbitrary bytes as `model.safetensors.index.json` beside the five shards of the step3p7
//! sharded fixture; the directory is opened (`Checkpoint::open`) and, when it opens, the step3p7
//! tower loaded from it. Must never panic.

use std::sync::OnceLock;

use vision_towers::st_reader::Checkpoint;
use vision_towers::tower_step::StepTower;
use vision_towers_fuzz::ModelDir;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    static DIR: OnceLock<ModelDir> = OnceLock::new();
    let dir = DIR.get_or_init(|| ModelDir::new("step3p7_sharded"));
    dir.with_file("model.safetensors.index.json", data, |dir| {
        if let Ok(ck) = Checkpoint::open(dir) {
            let _ = StepTower::from_checkpoint(&ck);
        }
    });
});
