//! vision-towers: facade over the readers, preparation and towers (stub).
#![deny(missing_docs)]
pub use gguf_reader;
pub use st_reader;
