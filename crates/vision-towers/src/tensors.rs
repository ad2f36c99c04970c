//! An image processor's output tensors handed in by a caller instead of image bytes, and the
//! family's tower inputs built from them (the upstream names and layouts).

use st_reader::Checkpoint;

use crate::tower_error::InputError;

/// An image processor's output tensors by their upstream names (`pixel_values`,
/// `image_grid_thw`, `image_position_ids`, `num_local_patches`, …) and layouts, as the
/// transformers processor returns them: the input of [`crate::Model::encode_tensors`] for
/// engines that keep their own processor. Float tensors are held as f32, integer and boolean
/// ones as i64.
#[derive(Debug, Default, Clone)]
pub struct ProcessorTensors {
    f32s: Vec<(String, Vec<usize>, Vec<f32>)>,
    i64s: Vec<(String, Vec<usize>, Vec<i64>)>,
}

/// A tensor whose values do not fill its shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tensor {name}: shape {shape:?} holds {expected} values, {got} given")]
pub struct TensorShapeError {
    /// The tensor's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Values the shape holds (saturating).
    pub expected: usize,
    /// Values given.
    pub got: usize,
}

fn check_fill(name: &str, shape: &[usize], got: usize) -> Result<(), TensorShapeError> {
    let expected = shape.iter().fold(1usize, |a, &d| a.saturating_mul(d));
    if expected == got {
        Ok(())
    } else {
        Err(TensorShapeError {
            name: name.to_string(),
            shape: shape.to_vec(),
            expected,
            got,
        })
    }
}

impl ProcessorTensors {
    /// An empty set.
    pub fn new() -> ProcessorTensors {
        ProcessorTensors::default()
    }

    /// Adds (or replaces) a float tensor, `values` row-major in `shape` (outermost first).
    pub fn insert_f32(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        values: Vec<f32>,
    ) -> Result<(), TensorShapeError> {
        check_fill(name, &shape, values.len())?;
        self.f32s.retain(|(n, _, _)| n != name);
        self.i64s.retain(|(n, _, _)| n != name);
        self.f32s.push((name.to_string(), shape, values));
        Ok(())
    }

    /// Adds (or replaces) an integer or boolean tensor, `values` row-major in `shape`.
    pub fn insert_i64(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        values: Vec<i64>,
    ) -> Result<(), TensorShapeError> {
        check_fill(name, &shape, values.len())?;
        self.f32s.retain(|(n, _, _)| n != name);
        self.i64s.retain(|(n, _, _)| n != name);
        self.i64s.push((name.to_string(), shape, values));
        Ok(())
    }

    /// The names held, floats first.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.f32s
            .iter()
            .map(|(n, _, _)| n.as_str())
            .chain(self.i64s.iter().map(|(n, _, _)| n.as_str()))
    }

    /// Reads every tensor of a safetensors file (`vtower prep`'s output).
    pub(crate) fn from_checkpoint(ck: &Checkpoint) -> Result<ProcessorTensors, String> {
        let mut set = ProcessorTensors::default();
        for info in ck.tensors() {
            let view = ck
                .tensor(&info.name)
                .ok_or_else(|| format!("tensor {} vanished", info.name))?;
            match view.dtype().as_str() {
                "I64" => {
                    let values = view
                        .bytes()
                        .chunks_exact(8)
                        .map(|c| {
                            i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
                        })
                        .collect();
                    set.i64s
                        .push((info.name.clone(), view.shape().to_vec(), values));
                }
                "U8" | "BOOL" => {
                    set.i64s.push((
                        info.name.clone(),
                        view.shape().to_vec(),
                        view.bytes().iter().map(|&b| i64::from(b)).collect(),
                    ));
                }
                "F32" | "BF16" | "F16" => {
                    let values = view.to_f32().map_err(|e| e.to_string())?;
                    set.f32s
                        .push((info.name.clone(), view.shape().to_vec(), values));
                }
                _ => {}
            }
        }
        Ok(set)
    }

    pub(crate) fn f32(&self, name: &str) -> Result<(&[f32], &[usize]), InputError> {
        self.f32s
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, s, v)| (v.as_slice(), s.as_slice()))
            .ok_or_else(|| InputError::Message(format!("no float tensor {name}")))
    }

    pub(crate) fn i64(&self, name: &str) -> Result<(&[i64], &[usize]), InputError> {
        self.i64s
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, s, v)| (v.as_slice(), s.as_slice()))
            .ok_or_else(|| InputError::Message(format!("no I64 tensor {name}")))
    }
}
