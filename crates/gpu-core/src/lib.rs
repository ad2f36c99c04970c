//! gpu-core (stub; filled in by the gpu-core issue).
#![deny(missing_docs)]
