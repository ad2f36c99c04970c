//! Metadata values: the thirteen GGUF value types and typed arrays.

/// A GGUF metadata value type (`gguf_type` in ggml, `GGUFValueType` in gguf-py); the set is
/// fixed by the format, so the enum is exhaustive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// Unsigned 8-bit integer (id 0).
    U8 = 0,
    /// Signed 8-bit integer (id 1).
    I8 = 1,
    /// Unsigned 16-bit integer (id 2).
    U16 = 2,
    /// Signed 16-bit integer (id 3).
    I16 = 3,
    /// Unsigned 32-bit integer (id 4).
    U32 = 4,
    /// Signed 32-bit integer (id 5).
    I32 = 5,
    /// 32-bit float (id 6).
    F32 = 6,
    /// Boolean, one byte 0 or 1 (id 7).
    Bool = 7,
    /// u64 length then UTF-8 bytes (id 8).
    String = 8,
    /// Element type, u64 count, then the elements (id 9).
    Array = 9,
    /// Unsigned 64-bit integer (id 10).
    U64 = 10,
    /// Signed 64-bit integer (id 11).
    I64 = 11,
    /// 64-bit float (id 12).
    F64 = 12,
}

impl ValueType {
    /// The type with this id, or `None` outside 0..=12.
    pub fn from_id(id: u32) -> Option<ValueType> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The type's id in GGUF files.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Short name: `u8`, `i8`, ..., `f32`, `bool`, `string`, `array`, `u64`, `i64`, `f64`.
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }

    /// Fewest bytes one value of this type takes in a file (as an array element).
    pub(crate) fn min_encoded_size(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 12,
        }
    }
}

impl std::fmt::Display for ValueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
///
/// String values are decoded with [`String::from_utf8_lossy`]: invalid UTF-8 (seen in some
/// tokenizer vocabularies) becomes U+FFFD rather than refusing the file. Keys must be valid UTF-8.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// `string` (decoded lossily, see the type's docs).
    String(String),
    /// `array`: element type and values, possibly nested.
    Array(MetaArray),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

impl MetaValue {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            MetaValue::U8(_) => ValueType::U8,
            MetaValue::I8(_) => ValueType::I8,
            MetaValue::U16(_) => ValueType::U16,
            MetaValue::I16(_) => ValueType::I16,
            MetaValue::U32(_) => ValueType::U32,
            MetaValue::I32(_) => ValueType::I32,
            MetaValue::F32(_) => ValueType::F32,
            MetaValue::Bool(_) => ValueType::Bool,
            MetaValue::String(_) => ValueType::String,
            MetaValue::Array(_) => ValueType::Array,
            MetaValue::U64(_) => ValueType::U64,
            MetaValue::I64(_) => ValueType::I64,
            MetaValue::F64(_) => ValueType::F64,
        }
    }

    /// The type's short name: `u32`, `string`, `array`, ...
    pub fn type_name(&self) -> &'static str {
        self.value_type().name()
    }

    /// Any integer variant, widened; `None` for floats, bools, strings and arrays.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// An integer of any width whose value fits in u32.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_i128().and_then(|v| u32::try_from(v).ok())
    }

    /// An integer of any width whose value fits in i32.
    pub fn as_i32(&self) -> Option<i32> {
        self.as_i128().and_then(|v| i32::try_from(v).ok())
    }

    /// An integer of any width whose value fits in u64.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// An integer of any width whose value fits in i64.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// An `f32`, or an `f64` rounded to f32.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// An `f64`, or an `f32` widened.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// A `bool`.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A `string`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(v) => Some(v),
            _ => None,
        }
    }

    /// An `array`.
    pub fn as_array(&self) -> Option<&MetaArray> {
        match self {
            MetaValue::Array(v) => Some(v),
            _ => None,
        }
    }

    /// Type and, for scalars, value, for error messages: `u64 5000000000`, `array of 3 f32`.
    pub(crate) fn describe(&self) -> String {
        match self {
            MetaValue::String(_) => "string".to_owned(),
            MetaValue::Array(a) => format!("array of {} {}", a.len(), a.elem_type()),
            MetaValue::U8(v) => format!("u8 {v}"),
            MetaValue::I8(v) => format!("i8 {v}"),
            MetaValue::U16(v) => format!("u16 {v}"),
            MetaValue::I16(v) => format!("i16 {v}"),
            MetaValue::U32(v) => format!("u32 {v}"),
            MetaValue::I32(v) => format!("i32 {v}"),
            MetaValue::U64(v) => format!("u64 {v}"),
            MetaValue::I64(v) => format!("i64 {v}"),
            MetaValue::F32(v) => format!("f32 {v}"),
            MetaValue::F64(v) => format!("f64 {v}"),
            MetaValue::Bool(v) => format!("bool {v}"),
        }
    }
}

/// A metadata array: its element type and its values (arrays may nest, each inner array with
/// its own element type).
///
/// Every element of `values` has type `elem_type`. Decoded values take up to 32 bytes each
/// whatever their encoded size (one byte for a u8), so metadata in memory is bounded by 32x
/// the file's size, never by a count read from it.
#[derive(Debug, Clone, PartialEq)]
pub struct MetaArray {
    elem_type: ValueType,
    values: Vec<MetaValue>,
}

impl MetaArray {
    /// An array of `values`, all of type `elem_type` (the parser's only constructor).
    pub(crate) fn new(elem_type: ValueType, values: Vec<MetaValue>) -> Self {
        MetaArray { elem_type, values }
    }

    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        self.elem_type
    }

    /// The element type's short name: `u32`, `string`, `array`, ...
    pub fn element_type_name(&self) -> &'static str {
        self.elem_type.name()
    }

    /// The elements, in file order.
    pub fn values(&self) -> &[MetaValue] {
        &self.values
    }

    /// Iterates over the elements.
    pub fn iter(&self) -> std::slice::Iter<'_, MetaValue> {
        self.values.iter()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Element `i`, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<&MetaValue> {
        self.values.get(i)
    }

    /// All elements widened to i128 when the element type is an integer; `None` otherwise.
    pub fn to_i128_vec(&self) -> Option<Vec<i128>> {
        self.values.iter().map(MetaValue::as_i128).collect()
    }

    /// `f32` elements as they are, or `f64` elements rounded to f32; `None` otherwise.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        self.values.iter().map(MetaValue::as_f32).collect()
    }

    /// `string` elements borrowed; `None` for other element types.
    pub fn to_str_vec(&self) -> Option<Vec<&str>> {
        self.values.iter().map(MetaValue::as_str).collect()
    }
}

impl<'a> IntoIterator for &'a MetaArray {
    type Item = &'a MetaValue;
    type IntoIter = std::slice::Iter<'a, MetaValue>;

    fn into_iter(self) -> Self::IntoIter {
        self.values.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_getters_accept_any_width_that_fits() {
        assert_eq!(MetaValue::I32(224).as_u32(), Some(224));
        assert_eq!(MetaValue::U8(7).as_u64(), Some(7));
        assert_eq!(MetaValue::I32(-1).as_u32(), None);
        assert_eq!(MetaValue::U64(u64::MAX).as_i64(), None);
        assert_eq!(MetaValue::I64(i64::MIN).as_i64(), Some(i64::MIN));
        assert_eq!(MetaValue::F32(1.0).as_u32(), None);
        assert_eq!(MetaValue::Bool(true).as_i128(), None);
        assert_eq!(MetaValue::F64(0.5).as_f32(), Some(0.5));
    }

    #[test]
    fn value_type_ids_round_trip() {
        for id in 0..13 {
            let t = ValueType::from_id(id).unwrap();
            assert_eq!(t.id(), id);
        }
        assert_eq!(ValueType::from_id(13), None);
    }

    #[test]
    fn arrays_convert_only_from_matching_element_types() {
        let ints = MetaArray::new(ValueType::U16, vec![MetaValue::U16(1), MetaValue::U16(2)]);
        assert_eq!(ints.to_i128_vec(), Some(vec![1, 2]));
        assert_eq!(ints.to_f32_vec(), None);
        assert_eq!(ints.element_type_name(), "u16");
        let strs = MetaArray::new(ValueType::String, vec![MetaValue::String("a".into())]);
        assert_eq!(strs.to_str_vec(), Some(vec!["a"]));
        assert_eq!(strs.to_i128_vec(), None);
    }
}
