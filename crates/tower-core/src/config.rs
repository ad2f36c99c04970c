//! The config checks every family makes, written once, and the one error they give: a config
//! value missing, of the wrong type or out of range, said in the config's own key names. A
//! family's own limits and laws (its merge sizes, its head-dim rule) stay in its crate.

use std::fmt;

use crate::{Activation, Classify, ErrorKind};

/// A config value that is missing, of the wrong type or out of range (the weights' fault: kind
/// [`ErrorKind::Weights`]). Every family error converts it into its `Config` variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(String);

impl ConfigError {
    /// The error that says `message`.
    pub fn new(message: impl Into<String>) -> ConfigError {
        ConfigError(message.into())
    }

    /// What is wrong, in the config's key names.
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl Classify for ConfigError {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Weights
    }
}

/// The activation the config's `key` names (`name`), by the one table every family reads
/// ([`crate::ACTIVATION_NAMES`]).
pub fn activation(key: &str, name: &str) -> Result<Activation, ConfigError> {
    Activation::from_name(name).map_err(|e| ConfigError(format!("{key} {e}")))
}

/// Refuses more encoder layers than `max` (a hostile count is refused before anything is sized
/// by it).
pub fn layers_within(layers: usize, max: usize) -> Result<(), ConfigError> {
    if layers > max {
        return Err(ConfigError(format!(
            "{layers} encoder layers exceed the limit of {max}"
        )));
    }
    Ok(())
}

/// Refuses a norm epsilon (named `eps_key` in the config) or a rope θ that is not a finite
/// positive number.
pub fn positive_eps_theta(eps_key: &str, eps: f64, theta: f64) -> Result<(), ConfigError> {
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !positive(eps) || !positive(theta) {
        return Err(ConfigError(format!(
            "{eps_key} {eps} and rope θ {theta} must be positive"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_say_the_key_and_the_value() {
        assert_eq!(activation("hidden_act", "silu"), Ok(Activation::Silu));
        let e = activation("hidden_act", "relu").unwrap_err();
        assert!(e
            .message()
            .starts_with("hidden_act \"relu\" is not supported"));
        assert_eq!(e.kind(), ErrorKind::Weights);
        assert!(layers_within(4, 4).is_ok());
        assert_eq!(
            layers_within(5, 4).unwrap_err().to_string(),
            "5 encoder layers exceed the limit of 4"
        );
        assert!(positive_eps_theta("eps", 1e-6, 100.0).is_ok());
        for (eps, theta) in [
            (0.0, 1.0),
            (1.0, f64::NAN),
            (-1.0, 1.0),
            (1.0, f64::INFINITY),
        ] {
            assert!(
                positive_eps_theta("eps", eps, theta).is_err(),
                "{eps} {theta}"
            );
        }
    }
}
