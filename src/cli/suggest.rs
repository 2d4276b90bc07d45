//! "Did you mean" for mistyped names, asked of clap itself, so that a mistyped command or `-o`
//! option is matched by the same similarity rule as the flags clap corrects on its own.

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// The subcommand of `top` that clap suggests for `word` typed in a command's place, if any.
pub fn subcommand(top: clap::Command, word: &str) -> Option<String> {
    let name = top.get_name().to_owned();
    let err = top.try_get_matches_from([name.as_str(), word]).err()?;
    if err.kind() != ErrorKind::InvalidSubcommand {
        return None;
    }
    match err.get(ContextKind::SuggestedSubcommand) {
        Some(ContextValue::Strings(names)) => names.first().cloned(),
        Some(ContextValue::String(name)) => Some(name.clone()),
        _ => None,
    }
}

/// The name among `names` that clap suggests for `word` (a value that is none of them), if any.
pub fn similar(word: &str, names: &[&'static str]) -> Option<&'static str> {
    let values = clap::builder::PossibleValuesParser::new(names.iter().copied());
    let err = clap::Command::new("similar")
        .no_binary_name(true)
        .arg(
            clap::Arg::new("value")
                .value_parser(values)
                .allow_hyphen_values(true),
        )
        .try_get_matches_from([word])
        .err()?;
    match err.get(ContextKind::SuggestedValue) {
        Some(ContextValue::String(s)) => names.iter().copied().find(|n| n == s),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_close_name_is_suggested_and_a_far_one_is_not() {
        let names = ["allow_other", "allow_root", "auto_unmount", "ro"];
        assert_eq!(similar("allow_othr", &names), Some("allow_other"));
        assert_eq!(similar("alow_root", &names), Some("allow_root"));
        assert_eq!(similar("fsname", &names), None);
        assert_eq!(similar("-x", &names), None);
        assert_eq!(similar("", &names), None);
        // A name that exists is no mistake.
        assert_eq!(similar("ro", &names), None);
    }

    #[test]
    fn subcommands_are_suggested_as_clap_does() {
        let top = || {
            clap::Command::new("tool")
                .subcommand(clap::Command::new("list"))
                .subcommand(clap::Command::new("mount"))
        };
        assert_eq!(subcommand(top(), "lst").as_deref(), Some("list"));
        assert_eq!(subcommand(top(), "mout").as_deref(), Some("mount"));
        assert_eq!(subcommand(top(), "archive.kpack"), None);
        assert_eq!(subcommand(top(), "list"), None);
    }
}
