//! Everything a call of the Python API can fail with, before it becomes a Python exception:
//! which exception class, the `kind` it carries (the adversarial corpus's error classes), the
//! image it is about, and the message (the command line's: the error and its causes on one line).

use vision_towers::tower_core::{Classify, ErrorKind};
use vision_towers::vision_prep::PrepError;
use vision_towers::{ModelError, PrepOpenError, TowerError};

/// The Python exception a failure raises (`vision_towers.<name>`, or a builtin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// `BadImageError`: an image was refused (admission, decoding, reading its file, a refused
    /// URI scheme, the pass ceiling).
    BadImage,
    /// `BadModelError`: the weight file, its configs or its tokenizer files were refused.
    BadModel,
    /// `BadInputError`: processor tensors (`encode_prepared`) were refused.
    BadInput,
    /// `NoDeviceError`: the CUDA device asked for does not open.
    NoDevice,
    /// `OutOfMemoryError`: the device ran out of memory; the model stays usable.
    OutOfMemory,
    /// `UnsupportedError`: a device, precision or dtype this model cannot give.
    Unsupported,
    /// `DeviceError`: any other CUDA failure.
    Device,
    /// `VisionTowersError` itself: a library bug (a panic, rows off their plan).
    Internal,
    /// The builtin `ValueError`: an argument out of its range.
    Value,
    /// The builtin `TypeError`: an argument of the wrong type.
    Type,
    /// The builtin `BufferError`: a DLPack export that cannot be made as asked.
    Buffer,
}

/// One failure, ready to be raised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Its exception class.
    pub class: Class,
    /// The error class in the adversarial corpus's terms (`prep:OverBudget`, `tower:Config`,
    /// `safetensors:InvalidJson`, `out_of_memory`, …).
    pub kind: String,
    /// The image it is about, by its position in the call.
    pub index: Option<usize>,
    /// The message.
    pub message: String,
}

impl Failure {
    /// A failure of `class` with `message`, of kind `kind`.
    pub fn new(class: Class, kind: &str, message: impl Into<String>) -> Failure {
        Failure {
            class,
            kind: kind.into(),
            index: None,
            message: message.into(),
        }
    }

    /// A `ValueError`.
    pub fn value(message: impl Into<String>) -> Failure {
        Failure::new(Class::Value, "value", message)
    }

    /// A `TypeError`.
    pub fn type_error(message: impl Into<String>) -> Failure {
        Failure::new(Class::Type, "type", message)
    }

    /// An `UnsupportedError`.
    pub fn unsupported(message: impl Into<String>) -> Failure {
        Failure::new(Class::Unsupported, "unsupported", message)
    }

    /// A `BufferError`.
    pub fn buffer(message: impl Into<String>) -> Failure {
        Failure::new(Class::Buffer, "buffer", message)
    }

    /// A panic caught at the boundary.
    pub fn panic(payload: &(dyn std::any::Any + Send)) -> Failure {
        let what = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("a panic without a message");
        Failure::new(
            Class::Internal,
            "panic",
            format!("internal error (a bug in vision-towers, please report it): {what}"),
        )
    }

    /// The library's error: the class of its kind ([`class_of`]), the image it names.
    pub fn model(e: &ModelError) -> Failure {
        Failure {
            class: class_of(e.kind()),
            kind: kind_of_model(e),
            index: e.image_index(),
            message: one_line(e),
        }
    }

    /// Image `index` could not be read (its file, its size, a refused URI).
    pub fn image_read(e: &PrepOpenError, index: Option<usize>) -> Failure {
        Failure {
            class: Class::BadImage,
            kind: kind_of_prep_open(e),
            index,
            message: one_line(e),
        }
    }

    /// An image refused by vision-prep while planning, named by `label` (its path or URI) as
    /// `vtower plan` names it.
    pub fn image_prep(e: &PrepError, label: Option<&str>, index: Option<usize>) -> Failure {
        let message = match label {
            Some(l) => format!("{l}: {}", one_line(e)),
            None => one_line(e),
        };
        Failure {
            class: Class::BadImage,
            kind: format!("prep:{}", variant(e)),
            index,
            message,
        }
    }
}

/// The exception class of each kind of failure, one to one: the library's errors state their
/// own kind, so nothing here guesses it from what the call was doing. A file that cannot be read
/// in a model's call is the model's (`BadModelError`; an image file the caller names is read by
/// [`Failure::image_read`]).
pub fn class_of(kind: ErrorKind) -> Class {
    match kind {
        ErrorKind::Setting => Class::Value,
        ErrorKind::Io | ErrorKind::Weights => Class::BadModel,
        ErrorKind::Image | ErrorKind::ImageTooLarge => Class::BadImage,
        ErrorKind::Input => Class::BadInput,
        ErrorKind::NoDevice => Class::NoDevice,
        ErrorKind::Unsupported => Class::Unsupported,
        ErrorKind::OutOfMemory => Class::OutOfMemory,
        ErrorKind::Device => Class::Device,
        ErrorKind::Internal => Class::Internal,
    }
}

/// The error and its causes on one line, each cause once (`vtower`'s `one_line`).
pub fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        let text = c.to_string().replace('\n', " ");
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = c.source();
    }
    parts.join(": ")
}

/// The variant name of an error enum, from its `Debug` form (`OverBudget { … }` → `OverBudget`).
fn variant(e: &dyn std::fmt::Debug) -> String {
    let s = format!("{e:?}");
    s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .next()
        .unwrap_or_default()
        .to_string()
}

fn kind_of_facade(e: &vision_towers::Error) -> String {
    use vision_towers::Error as E;
    match e {
        E::Gguf { source, .. } => format!("gguf:{}", variant(source)),
        E::SafeTensors { source, .. } => format!("safetensors:{}", variant(source)),
        E::Io { .. } => "io".into(),
        E::GgufDirectory { .. } => "format:GgufDirectory".into(),
        E::UnknownFormat { .. } => "format:UnknownFormat".into(),
    }
}

fn kind_of_tower(e: &TowerError) -> String {
    match e {
        TowerError::Open(e) => kind_of_facade(e),
        TowerError::UnknownFamily { .. } => "family:UnknownFamily".into(),
        TowerError::NotImplemented { .. } => "family:NotImplemented".into(),
        TowerError::Unsupported(_) => "unsupported".into(),
        TowerError::NoDevice { .. } => "no_device".into(),
        TowerError::OutOfMemory { .. } => "out_of_memory".into(),
        TowerError::Gpu { .. } => "gpu".into(),
        TowerError::OverPassCeiling { .. } => "over_pass_ceiling".into(),
        TowerError::Pass { source, .. } => kind_of_tower(source),
        TowerError::Refused { source, .. } => format!("tower:{}", variant(source)),
        TowerError::Inputs { .. } => "inputs".into(),
    }
}

fn kind_of_prep_open(e: &PrepOpenError) -> String {
    match e {
        PrepOpenError::Prep { source, .. } => format!("prep:{}", variant(source)),
        PrepOpenError::Tokenizer(e) => format!("safetensors:{}", variant(e)),
        PrepOpenError::Io { .. } => "io".into(),
        PrepOpenError::TooLarge { .. } => "io:TooLarge".into(),
    }
}

fn kind_of_model(e: &ModelError) -> String {
    match e {
        ModelError::Tower(t) | ModelError::ImageRefused(t) => kind_of_tower(t),
        ModelError::Prep(p) => kind_of_prep_open(p),
        ModelError::Image { source, .. } => format!("prep:{}", variant(source)),
        ModelError::RowsOffPlan { .. } => "bug:RowsOffPlan".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use vision_towers::vision_prep::PrepError;
    use vision_towers::Device;

    /// The weights' refusals raise BadModelError and the inputs' BadInputError, whatever the call.
    #[test]
    fn weights_and_inputs_have_their_own_classes() {
        assert_eq!(class_of(ErrorKind::Weights), Class::BadModel);
        assert_eq!(class_of(ErrorKind::Input), Class::BadInput);
        assert_eq!(class_of(ErrorKind::Image), Class::BadImage);
        assert_eq!(class_of(ErrorKind::Setting), Class::Value);
    }

    #[test]
    fn classes_follow_the_kind() {
        let img = ModelError::Image {
            index: 3,
            source: PrepError::NotAnImage("magic 00".into()),
        };
        let f = Failure::model(&img);
        assert_eq!(
            (f.class, f.kind.as_str(), f.index),
            (Class::BadImage, "prep:NotAnImage", Some(3))
        );
        assert_eq!(f.message, "image 3: not an image: magic 00");

        let nodev = ModelError::Tower(TowerError::NoDevice {
            device: Device::Cuda(1),
            reason: "no driver".into(),
        });
        let f = Failure::model(&nodev);
        assert_eq!((f.class, f.kind.as_str()), (Class::NoDevice, "no_device"));
        assert_eq!(f.message, "no usable CUDA device for cuda:1 (no driver)");

        let inputs = ModelError::Tower(TowerError::Inputs {
            path: PathBuf::from("<processor tensors>"),
            message: "no float tensor pixel_values".into(),
        });
        assert_eq!(Failure::model(&inputs).class, Class::BadInput);

        let ceiling = ModelError::Tower(TowerError::Pass {
            first: 4,
            last: 6,
            source: Box::new(TowerError::OverPassCeiling {
                path: PathBuf::from("m"),
                index: 1,
                patches: 9,
                ceiling: 8,
            }),
        });
        let f = Failure::model(&ceiling);
        assert_eq!((f.class, f.index), (Class::BadImage, Some(5)));

        let config = ModelError::Prep(PrepOpenError::Prep {
            path: PathBuf::from("m"),
            source: PrepError::Config {
                file: "preprocessor_config.json".into(),
                reason: "patch_size 0".into(),
            },
        });
        let f = Failure::model(&config);
        assert_eq!((f.class, f.kind.as_str()), (Class::BadModel, "prep:Config"));
        assert_eq!(
            f.message,
            "m: config error in preprocessor_config.json: patch_size 0"
        );

        assert_eq!(Failure::model(&config).class, Class::BadModel);

        let video = |source| {
            ModelError::Prep(PrepOpenError::Prep {
                path: PathBuf::from("m"),
                source,
            })
        };
        let f = Failure::model(&video(PrepError::NoVideoPath("step3p7".into())));
        assert_eq!(
            (f.class, f.kind.as_str()),
            (Class::Unsupported, "prep:NoVideoPath")
        );
        let over = PrepError::VideoOverBudget {
            what: "frames".into(),
            amount: 10_000,
            budget: 4096,
        };
        let f = Failure::model(&video(over));
        assert_eq!(
            (f.class, f.kind.as_str()),
            (Class::BadImage, "prep:VideoOverBudget")
        );
        let frame = PrepError::VideoFrame {
            index: 7,
            source: Box::new(PrepError::NotAnImage("magic 00".into())),
        };
        let f = Failure::model(&video(frame));
        assert_eq!((f.class, f.index), (Class::BadImage, Some(7)));
        let f = Failure::model(&video(PrepError::BadSetting("fps".into())));
        assert_eq!(f.class, Class::Value);
    }
}
