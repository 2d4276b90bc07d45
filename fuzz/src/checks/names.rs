//! `names`: arbitrary text as a TOC key and as an arch name.
//!
//! The property that matters is path safety: an accepted key joined under a directory stays
//! under it, and an accepted arch is one file name. So an accepted key is non-empty, relative,
//! and made only of normal path components (no empty, `.`, `..`, NUL, or over-long ones); an
//! accepted arch additionally has no `/`, and `<arch>.hsaco` maps back to the arch.

use std::path::{Component, Path};

use rocm_kpack::names::{self, NAME_MAX};

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let name = text.as_ref();

    if let Ok(parts) = names::key_components(name) {
        assert!(!name.is_empty() && !name.starts_with('/'));
        assert_eq!(parts.join("/"), name, "components do not rebuild the key");
        for p in &parts {
            assert!(
                !p.is_empty() && *p != "." && *p != ".." && !p.contains('/') && !p.contains('\0'),
                "{p:?}"
            );
            assert!(p.len() <= NAME_MAX);
        }
        let comps: Vec<Component<'_>> = Path::new(name).components().collect();
        assert_eq!(
            comps.len(),
            parts.len(),
            "{name:?} normalises to other components"
        );
        assert!(
            comps.iter().all(|c| matches!(c, Component::Normal(_))),
            "{name:?} escapes: {comps:?}"
        );
        assert!(Path::new("/base").join(name).starts_with("/base"));
    }

    if names::check_arch(name).is_ok() {
        assert!(!name.is_empty() && !name.contains('/') && !name.contains('\0'));
        assert!(name != "." && name != "..");
        let file = names::hsaco_name(name);
        assert!(file.len() <= NAME_MAX);
        assert_eq!(names::arch_from_hsaco_name(&file), Some(name));
        let comps: Vec<Component<'_>> = Path::new(&file).components().collect();
        assert!(
            matches!(comps.as_slice(), [Component::Normal(_)]),
            "{file:?} is not one file name"
        );
    }

    // The lookup key is always `<name>#<index>` and never loses the name.
    let index = data.first().copied().map_or(0, u32::from);
    let key = rocm_kpack::host::hipk::lookup_key(name, index);
    assert_eq!(key, format!("{name}#{index}"));
    assert_eq!(
        rocm_kpack::host::hipk::split_lookup_key(&key),
        Some((name, index))
    );
}
