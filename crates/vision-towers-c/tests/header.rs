//! The committed header is what cbindgen makes of this crate's source today: the test generates
//! it in memory (the cbindgen library, no binary needed) and compares. `VT_BLESS_HEADER=1`
//! rewrites the committed file instead.

use std::path::Path;

#[test]
fn committed_header_is_fresh() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let path = dir.join("include/vision_towers.h");
    if std::env::var_os("VT_BLESS_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write the header");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale: regenerate it with `VT_BLESS_HEADER=1 cargo test -p vision-towers-c --test \
         header` and commit it",
        path.display()
    );
}
