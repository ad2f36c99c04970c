//! vision-prep (stub; filled in by the vision-prep issue).
#![deny(missing_docs)]
