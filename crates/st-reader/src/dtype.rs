//! Element types as spelled in safetensors headers.

use std::fmt;

/// A tensor element type: the dtypes safetensors 0.8.0 defines, or [`Dtype::Other`] for a
/// spelling it does not know (listed, never rejected; size checks are skipped for it).
///
/// Variant names follow the safetensors crate's `Dtype` so the two read alike.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// Boolean, one byte.
    BOOL,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 16-bit integer.
    U16,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 64-bit integer.
    U64,
    /// Signed 64-bit integer.
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// FP8 E4M3 (the `float8_e4m3fn` variant).
    F8_E4M3,
    /// FP8 E5M2.
    F8_E5M2,
    /// FP8 E8M0 (OCP MX scale type, `float8_e8m0fnu`).
    F8_E8M0,
    /// FP8 E4M3 FNUZ.
    F8_E4M3FNUZ,
    /// FP8 E5M2 FNUZ.
    F8_E5M2FNUZ,
    /// OCP MX FP6 E2M3, 6 bits per element.
    F6_E2M3,
    /// OCP MX FP6 E3M2, 6 bits per element.
    F6_E3M2,
    /// OCP MX FP4 E2M1, 4 bits per element.
    F4,
    /// Complex with two f32 parts.
    C64,
    /// A spelling safetensors 0.8.0 does not define, kept verbatim.
    Other(String),
}

/// Every known dtype with its spelling and element size in bits
/// (safetensors 0.8.0 `Dtype::bitsize`, `safetensors/src/tensor.rs`).
const KNOWN: [(Dtype, &str, usize); 22] = [
    (Dtype::BOOL, "BOOL", 8),
    (Dtype::U8, "U8", 8),
    (Dtype::I8, "I8", 8),
    (Dtype::U16, "U16", 16),
    (Dtype::I16, "I16", 16),
    (Dtype::U32, "U32", 32),
    (Dtype::I32, "I32", 32),
    (Dtype::U64, "U64", 64),
    (Dtype::I64, "I64", 64),
    (Dtype::F16, "F16", 16),
    (Dtype::BF16, "BF16", 16),
    (Dtype::F32, "F32", 32),
    (Dtype::F64, "F64", 64),
    (Dtype::F8_E4M3, "F8_E4M3", 8),
    (Dtype::F8_E5M2, "F8_E5M2", 8),
    (Dtype::F8_E8M0, "F8_E8M0", 8),
    (Dtype::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8),
    (Dtype::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8),
    (Dtype::F6_E2M3, "F6_E2M3", 6),
    (Dtype::F6_E3M2, "F6_E3M2", 6),
    (Dtype::F4, "F4", 4),
    (Dtype::C64, "C64", 64),
];

impl Dtype {
    /// Parses a header spelling; unknown spellings become [`Dtype::Other`] (case-sensitive, as
    /// safetensors is).
    pub fn parse(spelling: &str) -> Dtype {
        KNOWN
            .iter()
            .find(|(_, s, _)| *s == spelling)
            .map_or_else(|| Dtype::Other(spelling.to_owned()), |(d, _, _)| d.clone())
    }

    /// The spelling as it appears in the file.
    pub fn as_str(&self) -> &str {
        match self {
            Dtype::Other(s) => s,
            known => KNOWN
                .iter()
                .find(|(d, _, _)| d == known)
                .map_or("", |(_, s, _)| s),
        }
    }

    /// Bits per element, or `None` for [`Dtype::Other`].
    pub fn bit_size(&self) -> Option<usize> {
        KNOWN.iter().find(|(d, _, _)| d == self).map(|(_, _, b)| *b)
    }

    /// Whether safetensors 0.8.0 defines this dtype.
    pub fn is_known(&self) -> bool {
        !matches!(self, Dtype::Other(_))
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for (d, s, _) in KNOWN.iter() {
            assert_eq!(Dtype::parse(s), *d);
            assert_eq!(d.as_str(), *s);
            assert_eq!(d.to_string(), *s);
        }
    }

    #[test]
    fn unknown_spelling_is_kept() {
        let d = Dtype::parse("Q4_K_X");
        assert_eq!(d, Dtype::Other("Q4_K_X".into()));
        assert_eq!(d.as_str(), "Q4_K_X");
        assert_eq!(d.bit_size(), None);
        assert!(!d.is_known());
        // safetensors spellings are case-sensitive.
        assert_eq!(Dtype::parse("bf16"), Dtype::Other("bf16".into()));
    }

    #[test]
    fn sub_byte_sizes_match_safetensors() {
        // safetensors 0.8.0 Dtype::bitsize.
        assert_eq!(Dtype::F4.bit_size(), Some(4));
        assert_eq!(Dtype::F6_E2M3.bit_size(), Some(6));
        assert_eq!(Dtype::F6_E3M2.bit_size(), Some(6));
        assert_eq!(Dtype::C64.bit_size(), Some(64));
        assert_eq!(Dtype::F8_E8M0.bit_size(), Some(8));
    }
}
