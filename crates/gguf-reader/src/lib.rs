//! GGUF reader (stub; filled in by the workspace-foundation issue).
#![deny(missing_docs)]
