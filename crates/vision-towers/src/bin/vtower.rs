//! The `vtower` command line (stub).
fn main() {}
