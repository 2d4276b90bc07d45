//! The loader's settings, read from the environment exactly once (when a cache is created).
//!
//! The configuration is built from an injected lookup function so that tests never have to touch
//! the process environment (`set_var` is racy under the multi-threaded test harness). The rules
//! match the reference library: a flag is "on" when the variable is set, non-empty and does not
//! start with `0` (so `false` switches it on); path lists are split on `:` and empty components
//! are dropped, with no trimming or other expansion.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

/// Archive files used instead of the binary's embedded search paths.
pub const ENV_PATH: &str = "ROCM_KPACK_PATH";
/// Archive files tried before the binary's embedded search paths.
pub const ENV_PATH_PREFIX: &str = "ROCM_KPACK_PATH_PREFIX";
/// Turns the loader off (`kpack_load_code_object` returns NOT_IMPLEMENTED).
pub const ENV_DISABLE: &str = "ROCM_KPACK_DISABLE";
/// Logs every loader decision to standard error.
pub const ENV_DEBUG: &str = "ROCM_KPACK_DEBUG";

/// What separates entries of a path-list variable.
pub const PATH_LIST_SEPARATOR: u8 = b':';

/// Loader settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoaderConfig {
    pub disabled: bool,
    pub debug: bool,
    /// `ROCM_KPACK_PATH`: when non-empty, the only archives tried.
    pub path_override: Vec<PathBuf>,
    /// `ROCM_KPACK_PATH_PREFIX`: archives tried before the embedded paths (ignored when an
    /// override is set).
    pub path_prefix: Vec<PathBuf>,
}

impl LoaderConfig {
    /// Builds the configuration from `lookup`, which returns a variable's value or `None` when
    /// it is unset.
    pub fn from_lookup<F>(lookup: F) -> LoaderConfig
    where
        F: Fn(&str) -> Option<OsString>,
    {
        LoaderConfig {
            disabled: is_enabled_flag(lookup(ENV_DISABLE).as_deref()),
            debug: is_enabled_flag(lookup(ENV_DEBUG).as_deref()),
            path_override: lookup(ENV_PATH)
                .map(|v| split_path_list(&v))
                .unwrap_or_default(),
            path_prefix: lookup(ENV_PATH_PREFIX)
                .map(|v| split_path_list(&v))
                .unwrap_or_default(),
        }
    }

    /// Builds the configuration from the process environment.
    pub fn from_env() -> LoaderConfig {
        LoaderConfig::from_lookup(|k| std::env::var_os(k))
    }
}

/// The reference's truthiness: set, non-empty and not starting with `0`.
pub fn is_enabled_flag(value: Option<&OsStr>) -> bool {
    match value.map(OsStr::as_bytes) {
        Some([first, ..]) => *first != b'0',
        _ => false,
    }
}

/// Splits a `:`-separated list, dropping empty components. Entries are used as given.
pub fn split_path_list(value: &OsStr) -> Vec<PathBuf> {
    value
        .as_bytes()
        .split(|b| *b == PATH_LIST_SEPARATOR)
        .filter(|part| !part.is_empty())
        .map(|part| PathBuf::from(OsString::from_vec(part.to_vec())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> LoaderConfig {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        LoaderConfig::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn nothing_set_means_defaults() {
        assert_eq!(config(&[]), LoaderConfig::default());
    }

    #[test]
    fn flag_truthiness_matches_reference() {
        for (value, on) in [
            ("1", true),
            ("yes", true),
            ("false", true),
            (" 0", true),
            ("0", false),
            ("00", false),
            ("0abc", false),
            ("", false),
        ] {
            let c = config(&[(ENV_DISABLE, value), (ENV_DEBUG, value)]);
            assert_eq!(c.disabled, on, "DISABLE={value:?}");
            assert_eq!(c.debug, on, "DEBUG={value:?}");
        }
    }

    #[test]
    fn path_lists_drop_empty_components_only() {
        let c = config(&[
            (ENV_PATH, "/test/path1:/test/path2"),
            (ENV_PATH_PREFIX, "::p q: "),
        ]);
        assert_eq!(
            c.path_override,
            [PathBuf::from("/test/path1"), PathBuf::from("/test/path2")]
        );
        assert_eq!(c.path_prefix, [PathBuf::from("p q"), PathBuf::from(" ")]);
        assert_eq!(
            config(&[(ENV_PATH, "a::b:")]).path_override,
            [PathBuf::from("a"), PathBuf::from("b")]
        );
        assert!(config(&[(ENV_PATH, "")]).path_override.is_empty());
        assert!(config(&[(ENV_PATH, ":::")]).path_override.is_empty());
    }

    #[test]
    fn gfxarch_token_is_not_expanded_in_env_paths() {
        let c = config(&[(ENV_PATH, "/x/foo_@GFXARCH@.kpack")]);
        assert_eq!(c.path_override, [PathBuf::from("/x/foo_@GFXARCH@.kpack")]);
    }
}
