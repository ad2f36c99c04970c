//! ggml tensor types: ids, names, block and type sizes.

/// A ggml tensor type, as stored in a GGUF tensor info.
///
/// Ids, names, block sizes and type sizes follow gguf-py 0.19.0's `GGMLQuantizationType` and
/// `GGML_QUANT_SIZES` (`gguf/constants.py`); ids ggml retired (4, 5, 31..=33, 36..=38) are unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
#[non_exhaustive]
pub enum GgmlType {
    /// `F32`: 1 element per 4-byte block.
    F32 = 0,
    /// `F16`: 1 element per 2-byte block.
    F16 = 1,
    /// `Q4_0`: 32 elements per 18-byte block.
    Q4_0 = 2,
    /// `Q4_1`: 32 elements per 20-byte block.
    Q4_1 = 3,
    /// `Q5_0`: 32 elements per 22-byte block.
    Q5_0 = 6,
    /// `Q5_1`: 32 elements per 24-byte block.
    Q5_1 = 7,
    /// `Q8_0`: 32 elements per 34-byte block.
    Q8_0 = 8,
    /// `Q8_1`: 32 elements per 40-byte block.
    Q8_1 = 9,
    /// `Q2_K`: 256 elements per 84-byte block.
    Q2_K = 10,
    /// `Q3_K`: 256 elements per 110-byte block.
    Q3_K = 11,
    /// `Q4_K`: 256 elements per 144-byte block.
    Q4_K = 12,
    /// `Q5_K`: 256 elements per 176-byte block.
    Q5_K = 13,
    /// `Q6_K`: 256 elements per 210-byte block.
    Q6_K = 14,
    /// `Q8_K`: 256 elements per 292-byte block.
    Q8_K = 15,
    /// `IQ2_XXS`: 256 elements per 66-byte block.
    IQ2_XXS = 16,
    /// `IQ2_XS`: 256 elements per 74-byte block.
    IQ2_XS = 17,
    /// `IQ3_XXS`: 256 elements per 98-byte block.
    IQ3_XXS = 18,
    /// `IQ1_S`: 256 elements per 50-byte block.
    IQ1_S = 19,
    /// `IQ4_NL`: 32 elements per 18-byte block.
    IQ4_NL = 20,
    /// `IQ3_S`: 256 elements per 110-byte block.
    IQ3_S = 21,
    /// `IQ2_S`: 256 elements per 82-byte block.
    IQ2_S = 22,
    /// `IQ4_XS`: 256 elements per 136-byte block.
    IQ4_XS = 23,
    /// `I8`: 1 element per 1-byte block.
    I8 = 24,
    /// `I16`: 1 element per 2-byte block.
    I16 = 25,
    /// `I32`: 1 element per 4-byte block.
    I32 = 26,
    /// `I64`: 1 element per 8-byte block.
    I64 = 27,
    /// `F64`: 1 element per 8-byte block.
    F64 = 28,
    /// `IQ1_M`: 256 elements per 56-byte block.
    IQ1_M = 29,
    /// `BF16`: 1 element per 2-byte block.
    BF16 = 30,
    /// `TQ1_0`: 256 elements per 54-byte block.
    TQ1_0 = 34,
    /// `TQ2_0`: 256 elements per 66-byte block.
    TQ2_0 = 35,
    /// `MXFP4`: 32 elements per 17-byte block.
    MXFP4 = 39,
    /// `NVFP4`: 64 elements per 36-byte block.
    NVFP4 = 40,
    /// `Q1_0`: 128 elements per 18-byte block.
    Q1_0 = 41,
}

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: [GgmlType; 34] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::NVFP4,
        GgmlType::Q1_0,
    ];

    /// The type with this id, or `None` for an id ggml does not define (or has retired).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            9 => GgmlType::Q8_1,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            15 => GgmlType::Q8_K,
            16 => GgmlType::IQ2_XXS,
            17 => GgmlType::IQ2_XS,
            18 => GgmlType::IQ3_XXS,
            19 => GgmlType::IQ1_S,
            20 => GgmlType::IQ4_NL,
            21 => GgmlType::IQ3_S,
            22 => GgmlType::IQ2_S,
            23 => GgmlType::IQ4_XS,
            24 => GgmlType::I8,
            25 => GgmlType::I16,
            26 => GgmlType::I32,
            27 => GgmlType::I64,
            28 => GgmlType::F64,
            29 => GgmlType::IQ1_M,
            30 => GgmlType::BF16,
            34 => GgmlType::TQ1_0,
            35 => GgmlType::TQ2_0,
            39 => GgmlType::MXFP4,
            40 => GgmlType::NVFP4,
            41 => GgmlType::Q1_0,
            _ => return None,
        })
    }

    /// The type's id in GGUF files.
    pub fn id(self) -> u32 {
        self as u32
    }

    fn traits(self) -> (&'static str, u32, u32) {
        match self {
            GgmlType::F32 => ("F32", 1, 4),
            GgmlType::F16 => ("F16", 1, 2),
            GgmlType::Q4_0 => ("Q4_0", 32, 18),
            GgmlType::Q4_1 => ("Q4_1", 32, 20),
            GgmlType::Q5_0 => ("Q5_0", 32, 22),
            GgmlType::Q5_1 => ("Q5_1", 32, 24),
            GgmlType::Q8_0 => ("Q8_0", 32, 34),
            GgmlType::Q8_1 => ("Q8_1", 32, 40),
            GgmlType::Q2_K => ("Q2_K", 256, 84),
            GgmlType::Q3_K => ("Q3_K", 256, 110),
            GgmlType::Q4_K => ("Q4_K", 256, 144),
            GgmlType::Q5_K => ("Q5_K", 256, 176),
            GgmlType::Q6_K => ("Q6_K", 256, 210),
            GgmlType::Q8_K => ("Q8_K", 256, 292),
            GgmlType::IQ2_XXS => ("IQ2_XXS", 256, 66),
            GgmlType::IQ2_XS => ("IQ2_XS", 256, 74),
            GgmlType::IQ3_XXS => ("IQ3_XXS", 256, 98),
            GgmlType::IQ1_S => ("IQ1_S", 256, 50),
            GgmlType::IQ4_NL => ("IQ4_NL", 32, 18),
            GgmlType::IQ3_S => ("IQ3_S", 256, 110),
            GgmlType::IQ2_S => ("IQ2_S", 256, 82),
            GgmlType::IQ4_XS => ("IQ4_XS", 256, 136),
            GgmlType::I8 => ("I8", 1, 1),
            GgmlType::I16 => ("I16", 1, 2),
            GgmlType::I32 => ("I32", 1, 4),
            GgmlType::I64 => ("I64", 1, 8),
            GgmlType::F64 => ("F64", 1, 8),
            GgmlType::IQ1_M => ("IQ1_M", 256, 56),
            GgmlType::BF16 => ("BF16", 1, 2),
            GgmlType::TQ1_0 => ("TQ1_0", 256, 54),
            GgmlType::TQ2_0 => ("TQ2_0", 256, 66),
            GgmlType::MXFP4 => ("MXFP4", 32, 17),
            GgmlType::NVFP4 => ("NVFP4", 64, 36),
            GgmlType::Q1_0 => ("Q1_0", 128, 18),
        }
    }

    /// The name as gguf-py spells it: `F32`, `F16`, `BF16`, `Q8_0`, `Q4_K`, ...
    pub fn name(self) -> &'static str {
        self.traits().0
    }

    /// Elements per block (1 for plain types).
    pub fn block_size(self) -> u32 {
        self.traits().1
    }

    /// Bytes per block.
    pub fn type_size(self) -> u32 {
        self.traits().2
    }

    /// Whether [`crate::GgufFile::to_f32`] and [`crate::GgufFile::to_bf16`] convert this type.
    pub fn is_convertible(self) -> bool {
        matches!(
            self,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_0
        )
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_sizes_are_sane() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert!(t.block_size() >= 1 && t.type_size() >= 1, "{t}");
            assert_eq!(t.to_string(), t.name());
        }
        let convertible: Vec<_> = GgmlType::ALL
            .iter()
            .filter(|t| t.is_convertible())
            .collect();
        assert_eq!(
            convertible,
            [
                &GgmlType::F32,
                &GgmlType::F16,
                &GgmlType::Q8_0,
                &GgmlType::BF16
            ]
        );
    }
}
