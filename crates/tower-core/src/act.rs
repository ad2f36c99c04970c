//! The activation functions of the towers' MLPs, by the names transformers' `ACT2FN` gives them.

/// An activation function (gated or plain). The kernels and host twins that compute them live in
/// gpu-core; this is the name every config is read into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `0.5x(1+tanh(√(2/π)(x+0.044715x³)))` (`gelu_pytorch_tanh`, `gelu_new`).
    GeluTanh,
    /// `x·σ(1.702x)` (`quick_gelu`).
    QuickGelu,
    /// `0.5x(1+erf(x/√2))` (`gelu`, `nn.GELU()`).
    GeluErf,
    /// `x·σ(x)` (`silu`, `swish`).
    Silu,
    /// `x` (with clamps: a plain clamp).
    Identity,
}

/// The activation names a config may give and what each computes: transformers' `ACT2FN` keys
/// (activations.py: `gelu` → `GELUActivation`, erf; `gelu_new` → `NewGELUActivation` and
/// `gelu_pytorch_tanh` → `PytorchGELUTanh`, both the tanh form; `quick_gelu` → `QuickGELUActivation`;
/// `silu` / `swish` → `nn.SiLU`) plus `gelu_tanh` and `gelu_quick`, the spellings llama.cpp and
/// some vendor configs write for the same two functions.
pub const ACTIVATION_NAMES: [(&str, Activation); 8] = [
    ("gelu_pytorch_tanh", Activation::GeluTanh),
    ("gelu_new", Activation::GeluTanh),
    ("gelu_tanh", Activation::GeluTanh),
    ("gelu", Activation::GeluErf),
    ("quick_gelu", Activation::QuickGelu),
    ("gelu_quick", Activation::QuickGelu),
    ("silu", Activation::Silu),
    ("swish", Activation::Silu),
];

/// An activation name no tower computes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not supported (known: gelu, gelu_pytorch_tanh, gelu_new, gelu_tanh, quick_gelu, gelu_quick, silu, swish)")]
pub struct UnknownActivation(pub String);

impl Activation {
    /// The activation a config names (see [`ACTIVATION_NAMES`]); the same table for every
    /// family, so no family accepts a spelling another refuses.
    pub fn from_name(name: &str) -> Result<Activation, UnknownActivation> {
        ACTIVATION_NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, a)| a)
            .ok_or_else(|| UnknownActivation(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_reads_and_others_are_refused() {
        for (name, act) in ACTIVATION_NAMES {
            assert_eq!(Activation::from_name(name), Ok(act));
            assert!(UnknownActivation("x".into()).to_string().contains(name));
        }
        for bad in ["relu", "GELU", "gelu_10", ""] {
            assert!(Activation::from_name(bad).is_err(), "{bad}");
        }
    }
}
