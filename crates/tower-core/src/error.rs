//! Whose fault a failure is: the one classification the C ABI's statuses and Python's exception
//! classes are read from.

use std::fmt;

/// What kind of failure an error is. Every error type of the library states its own kind
/// ([`Classify`]); the bindings map kinds to their statuses and exception classes one to one and
/// never guess a kind from what the call was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A setting or argument out of its range (a budget the processor cannot use, no pass room).
    Setting,
    /// A file could not be read: missing, unreadable, a directory without a checkpoint.
    Io,
    /// The weight file or its configs are wrong: not GGUF or safetensors, malformed, a family not
    /// supported, a missing, unknown or misshapen tensor, a config value out of range.
    Weights,
    /// An image (or a video's frame or metadata) was refused: not an image, a format not decoded,
    /// corrupt, truncated, a refused URI, a size its model cannot plan or take.
    Image,
    /// An image is over a limit: the decode budget, the data URI cap, the output budget, a video
    /// budget, or more patches than one pass holds.
    ImageTooLarge,
    /// Prepared inputs were refused: a missing or mistyped tensor, a shape that does not fit the
    /// model, an inconsistent grid or count.
    Input,
    /// A CUDA device was asked for and none opens.
    NoDevice,
    /// The request is valid but not available here: bf16 on the CPU or on a GPU tier without bf16
    /// tensor cores, device rows from a model on the CPU, video for a family without a video path,
    /// a shape the CUDA kernels do not cover.
    Unsupported,
    /// The device ran out of memory; the tower stays usable.
    OutOfMemory,
    /// Any other device failure (driver, launch, cuBLASLt).
    Device,
    /// A broken promise inside the library: a bug.
    Internal,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 11] = [
        ErrorKind::Setting,
        ErrorKind::Io,
        ErrorKind::Weights,
        ErrorKind::Image,
        ErrorKind::ImageTooLarge,
        ErrorKind::Input,
        ErrorKind::NoDevice,
        ErrorKind::Unsupported,
        ErrorKind::OutOfMemory,
        ErrorKind::Device,
        ErrorKind::Internal,
    ];

    /// The kind's name in snake case (`weights`, `image_too_large`, …).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Setting => "setting",
            ErrorKind::Io => "io",
            ErrorKind::Weights => "weights",
            ErrorKind::Image => "image",
            ErrorKind::ImageTooLarge => "image_too_large",
            ErrorKind::Input => "input",
            ErrorKind::NoDevice => "no_device",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::OutOfMemory => "out_of_memory",
            ErrorKind::Device => "device",
            ErrorKind::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An error that knows its [`ErrorKind`].
pub trait Classify {
    /// Whose fault this failure is.
    fn kind(&self) -> ErrorKind;
}

/// An error that states its kind and can cross threads: what [`FamilyError`] boxes.
pub trait ClassifiedError: std::error::Error + Classify + Send + Sync + 'static {}

impl<E: std::error::Error + Classify + Send + Sync + 'static> ClassifiedError for E {}

/// A family tower's own error (the weights or the input are wrong), boxed so that code written
/// once over every family carries it without naming the family. `Display`, `Debug`, the
/// source chain and the kind are the boxed error's own.
pub struct FamilyError(Box<dyn ClassifiedError>);

impl FamilyError {
    /// Boxes a family's error.
    pub fn new(e: impl ClassifiedError) -> FamilyError {
        FamilyError(Box::new(e))
    }

    /// The family's error as its own type, when it is a `T`.
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        let e: &(dyn std::error::Error + 'static) = &*self.0;
        e.downcast_ref::<T>()
    }
}

impl fmt::Debug for FamilyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for FamilyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl std::error::Error for FamilyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl Classify for FamilyError {
    fn kind(&self) -> ErrorKind {
        self.0.kind()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_have_distinct_names() {
        let names: std::collections::HashSet<_> = ErrorKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), ErrorKind::ALL.len());
        assert_eq!(ErrorKind::ImageTooLarge.to_string(), "image_too_large");
    }

    #[derive(Debug, thiserror::Error)]
    enum Fam {
        #[error("input: {0}")]
        Input(String),
        #[error("missing tensor {0}")]
        Missing(String),
    }

    impl Classify for Fam {
        fn kind(&self) -> ErrorKind {
            match self {
                Fam::Input(_) => ErrorKind::Input,
                Fam::Missing(_) => ErrorKind::Weights,
            }
        }
    }

    /// The box is transparent: its text, its `Debug` (the variant the bindings report), its kind
    /// and the type behind it are the family error's.
    #[test]
    fn a_boxed_family_error_keeps_its_text_kind_and_type() {
        let e = FamilyError::new(Fam::Missing("v.w".into()));
        assert_eq!(e.to_string(), "missing tensor v.w");
        assert!(format!("{e:?}").starts_with("Missing("));
        assert_eq!(e.kind(), ErrorKind::Weights);
        assert!(matches!(e.downcast_ref::<Fam>(), Some(Fam::Missing(_))));
        assert_eq!(
            FamilyError::new(Fam::Input("x".into())).kind(),
            ErrorKind::Input
        );
        assert!(e.downcast_ref::<std::io::Error>().is_none());
    }
}
