//! Naming rules shared by every face of the tool: the `<arch>.hsaco` file name, and the one
//! definition of a *safe path component* ([`check_component`]) that decides which TOC keys, arch
//! names, archive prefixes and `@GFXARCH@` substitutions can become (parts of) file names
//! without escaping a directory (`extract`, the mount, `pack`, `pack --from-fatbin`, `split`,
//! the loader's search paths).

/// Extension of a code-object file in a tree (`<key>/<arch>.hsaco`).
pub const HSACO_EXT: &str = "hsaco";

/// Longest file-name component Linux accepts.
pub const NAME_MAX: usize = 255;

/// The file name an arch is shown as.
pub fn hsaco_name(arch: &str) -> String {
    format!("{arch}.{HSACO_EXT}")
}

/// The arch named by a `<arch>.hsaco` file name, if it has that form.
pub fn arch_from_hsaco_name(name: &str) -> Option<&str> {
    name.strip_suffix(HSACO_EXT)?
        .strip_suffix('.')
        .filter(|a| !a.is_empty())
}

/// The one rule for a safe path component: a string that, used as one file name (or as part of
/// one), names a file inside its directory. Refused: empty, `.` and `..`, `/`, NUL, and more
/// than [`NAME_MAX`] bytes. Anything else is allowed (spaces, `:`, `+`, `@`, non-ASCII): Linux
/// accepts it, and refusing more would make one command refuse what another wrote.
pub fn check_component(c: &str) -> Result<(), String> {
    if c.is_empty() {
        return Err("has an empty path component".into());
    }
    if c == "." || c == ".." {
        return Err(format!("has a '{c}' component"));
    }
    if c.contains('/') {
        return Err("contains '/'".into());
    }
    if c.contains('\0') {
        return Err("contains a NUL byte".into());
    }
    if c.len() > NAME_MAX {
        return Err(format!(
            "has a component of {} bytes (limit {NAME_MAX})",
            c.len()
        ));
    }
    Ok(())
}

/// [`check_component`] as a yes/no answer.
pub fn is_safe_component(c: &str) -> bool {
    check_component(c).is_ok()
}

/// Splits a TOC key into directory names, refusing keys that could escape a directory or cannot
/// be file names: absolute keys, empty components, `.` or `..`, NUL, over-long components.
pub fn key_components(key: &str) -> Result<Vec<&str>, String> {
    if key.is_empty() {
        return Err("key is empty".into());
    }
    if key.starts_with('/') {
        return Err(format!("key {key:?} is absolute"));
    }
    let parts: Vec<&str> = key.split('/').collect();
    for p in &parts {
        check_component(p).map_err(|why| format!("key {key:?} {why}"))?;
    }
    Ok(parts)
}

/// Refuses arch names that cannot be a single file name once `.hsaco` is appended.
pub fn check_arch(arch: &str) -> Result<(), String> {
    if arch.is_empty() {
        return Err("arch name is empty".into());
    }
    check_component(arch).map_err(|why| format!("arch {arch:?} {why}"))?;
    check_component(&hsaco_name(arch)).map_err(|why| format!("arch {arch:?} file name {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hsaco_names_round_trip() {
        assert_eq!(hsaco_name("gfx90a:xnack-"), "gfx90a:xnack-.hsaco");
        assert_eq!(
            arch_from_hsaco_name("gfx90a:xnack-.hsaco"),
            Some("gfx90a:xnack-")
        );
        assert_eq!(arch_from_hsaco_name(".hsaco"), None);
        assert_eq!(arch_from_hsaco_name("gfx900.bin"), None);
    }

    #[test]
    fn keys_that_escape_are_refused() {
        assert_eq!(
            key_components("lib/libx.so#0").unwrap(),
            vec!["lib", "libx.so#0"]
        );
        for bad in [
            "",
            "/etc/passwd",
            "a/../b",
            "..",
            "a//b",
            "a/",
            "./a",
            "a\0b",
            &"x".repeat(256),
        ] {
            assert!(key_components(bad).is_err(), "{bad:?}");
        }
        assert_eq!(key_components(&"x".repeat(255)).unwrap().len(), 1);
    }

    #[test]
    fn safe_components() {
        for good in [
            "gfx942:sramecc+",
            "gfx 900",
            "a@b",
            "é",
            "..a",
            &"x".repeat(255),
        ] {
            assert_eq!(check_component(good), Ok(()), "{good:?}");
        }
        for (bad, why) in [
            ("", "has an empty path component"),
            (".", "has a '.' component"),
            ("..", "has a '..' component"),
            ("a/b", "contains '/'"),
            ("a\0", "contains a NUL byte"),
        ] {
            assert_eq!(check_component(bad), Err(why.to_string()), "{bad:?}");
            assert!(!is_safe_component(bad));
        }
        assert!(!is_safe_component(&"x".repeat(256)));
    }

    #[test]
    fn arches_that_escape_are_refused() {
        assert!(check_arch("gfx942:sramecc+:xnack-").is_ok());
        for bad in ["", "a/b", "..", ".", "x\0", &"g".repeat(250)] {
            assert!(check_arch(bad).is_err(), "{bad:?}");
        }
    }
}
