//! How the commands phrase counts in what they print: "1 kernel", "2 kernels", never
//! "1 kernels" or "archive(s)". One helper, so every message follows the same rule.

/// `n` followed by the singular or the plural noun, as `n` asks.
pub fn count(n: impl Into<u64>, singular: &str, plural: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { singular } else { plural })
}

/// [`count`] for a `usize` (lengths and counters), which has no `Into<u64>`.
pub fn count_of(n: usize, singular: &str, plural: &str) -> String {
    count(n as u64, singular, plural)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_is_singular_everything_else_plural() {
        assert_eq!(count(0u32, "wrapper", "wrappers"), "0 wrappers");
        assert_eq!(count(1u32, "wrapper", "wrappers"), "1 wrapper");
        assert_eq!(count(2u64, "binary", "binaries"), "2 binaries");
        assert_eq!(count_of(1, "binary", "binaries"), "1 binary");
    }
}
