//! Typed reads of a model's JSON config values, written once for every family: a missing or
//! `null` key is `None`, a value of the wrong type is a [`ConfigError`] that names the key and
//! the value found.

use serde_json::Value;
use tower_core::{Activation, ConfigError};

/// `v[key]` as a non-negative integer that fits a `usize`; `None` when absent or `null`.
pub fn opt_usize(v: &Value, key: &str) -> Result<Option<usize>, ConfigError> {
    typed(v, key, "a non-negative integer", |x| {
        x.as_u64().and_then(|n| usize::try_from(n).ok())
    })
}

/// `v[key]` as [`opt_usize`], required.
pub fn req_usize(v: &Value, key: &str) -> Result<usize, ConfigError> {
    opt_usize(v, key)?.ok_or_else(|| ConfigError::new(format!("{key} missing")))
}

/// `v[key]` as a number; `None` when absent or `null`.
pub fn opt_f64(v: &Value, key: &str) -> Result<Option<f64>, ConfigError> {
    typed(v, key, "a number", Value::as_f64)
}

/// `v[key]` as a boolean; `None` when absent or `null`.
pub fn opt_bool(v: &Value, key: &str) -> Result<Option<bool>, ConfigError> {
    typed(v, key, "a boolean", Value::as_bool)
}

/// The activation `v[key]` names, `default` when the key holds no string, by the one table every
/// family reads ([`tower_core::ACTIVATION_NAMES`]).
pub fn activation(v: &Value, key: &str, default: &str) -> Result<Activation, ConfigError> {
    let name = v.get(key).and_then(Value::as_str).unwrap_or(default);
    tower_core::config::activation(key, name)
}

fn typed<T>(
    v: &Value,
    key: &str,
    what: &str,
    read: impl FnOnce(&Value) -> Option<T>,
) -> Result<Option<T>, ConfigError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => read(x)
            .map(Some)
            .ok_or_else(|| ConfigError::new(format!("{key} = {x} is not {what}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn absent_and_null_are_none_and_wrong_types_name_key_and_value() {
        let v = json!({"a": 3, "n": null, "f": 1.5, "b": true, "s": "x", "act": "silu"});
        assert_eq!(opt_usize(&v, "a"), Ok(Some(3)));
        assert_eq!(opt_usize(&v, "n"), Ok(None));
        assert_eq!(opt_usize(&v, "zz"), Ok(None));
        assert_eq!(
            opt_usize(&v, "f").unwrap_err().message(),
            "f = 1.5 is not a non-negative integer"
        );
        assert_eq!(req_usize(&v, "zz").unwrap_err().message(), "zz missing");
        assert_eq!(opt_f64(&v, "f"), Ok(Some(1.5)));
        assert_eq!(
            opt_f64(&v, "s").unwrap_err().message(),
            "s = \"x\" is not a number"
        );
        assert_eq!(opt_bool(&v, "b"), Ok(Some(true)));
        assert_eq!(
            opt_bool(&v, "a").unwrap_err().message(),
            "a = 3 is not a boolean"
        );
        assert_eq!(activation(&v, "act", "gelu"), Ok(Activation::Silu));
        assert_eq!(activation(&v, "none", "gelu"), Ok(Activation::GeluErf));
        assert!(activation(&v, "s", "gelu").is_err());
    }
}
