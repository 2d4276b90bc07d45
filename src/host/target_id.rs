//! Target-ID rules: the one implementation of how an AMDGPU target name is parsed, which archive
//! arches a device can use (feature subsets, most specific first), and the generic target of a
//! processor. The loader, the mount and the CLI all call into this module; nothing else decides
//! whether two target names match.

/// The triple prefix the HIP runtime puts in front of ISA names.
const TRIPLE_PREFIX: &str = "amdgcn-amd-amdhsa--";

/// A parsed target ID such as `gfx942:sramecc+:xnack-`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetId {
    pub processor: String,
    /// Features exactly as written (sign included), in their original order.
    pub features: Vec<String>,
}

/// Removes the `amdgcn-amd-amdhsa--` prefix, but only when something follows it: the bare prefix
/// is left as it is (and then names no processor anyone has).
pub fn strip_target_prefix(name: &str) -> &str {
    if name.len() > TRIPLE_PREFIX.len() {
        if let Some(rest) = name.strip_prefix(TRIPLE_PREFIX) {
            return rest;
        }
    }
    name
}

impl TargetId {
    /// Splits on `:`; the first piece is the processor, the other non-empty pieces are features.
    /// Returns `None` when there is no processor.
    pub fn parse(name: &str) -> Option<TargetId> {
        let mut parts = name.split(':');
        let processor = parts.next().unwrap_or("");
        if processor.is_empty() {
            return None;
        }
        let features = parts.filter(|p| !p.is_empty()).map(str::to_owned).collect();
        Some(TargetId {
            processor: processor.to_owned(),
            features,
        })
    }
}

impl std::fmt::Display for TargetId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.processor)?;
        for feat in &self.features {
            write!(f, ":{feat}")?;
        }
        Ok(())
    }
}

/// More features than this would make the subset list explode (2^n names); real targets have
/// at most two, so longer lists are cut to their first `MAX_FEATURES` entries.
pub const MAX_FEATURES: usize = 8;

/// Every archive arch a device named `agent_isa` can run, most specific first: the processor
/// with every subset of its features, dropping features from the right first. The triple prefix
/// is stripped. Signs are never flipped: `xnack-` code is not `xnack+` code.
pub fn compatible_targets(agent_isa: &str) -> Vec<String> {
    let Some(target) = TargetId::parse(strip_target_prefix(agent_isa)) else {
        return Vec::new();
    };
    let features = &target.features[..target.features.len().min(MAX_FEATURES)];
    let n = features.len();
    let mut out = Vec::with_capacity(1 << n);
    for mask in (0..(1u32 << n)).rev() {
        let mut name = target.processor.clone();
        for (i, feat) in features.iter().enumerate() {
            if mask & (1 << (n - 1 - i)) != 0 {
                name.push(':');
                name.push_str(feat);
            }
        }
        out.push(name);
    }
    out
}

/// The generic targets the HIP runtime maps concrete processors to.
const GENERIC_TABLE: &[(&str, &[&str])] = &[
    (
        "gfx9-generic",
        &["gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"],
    ),
    ("gfx9-4-generic", &["gfx942", "gfx950"]),
    (
        "gfx10-1-generic",
        &["gfx1010", "gfx1011", "gfx1012", "gfx1013"],
    ),
    (
        "gfx10-3-generic",
        &[
            "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036",
        ],
    ),
    (
        "gfx11-generic",
        &[
            "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153",
        ],
    ),
    ("gfx12-generic", &["gfx1200", "gfx1201"]),
    ("gfx12-5-generic", &["gfx1250"]),
];

/// The generic processor a concrete processor belongs to, if any (`gfx1101` -> `gfx11-generic`).
fn generic_processor(processor: &str) -> Option<&'static str> {
    GENERIC_TABLE
        .iter()
        .find(|(_, members)| members.contains(&processor))
        .map(|(generic, _)| *generic)
}

/// The generic ISA for a device ISA, as the HIP runtime builds it: features dropped, the generic
/// processor looked up, then `:sramecc±` and `:xnack±` put back (in that order) when the input had
/// them. The triple prefix is kept when the input had one.
pub fn generic_isa(isa: &str) -> Option<String> {
    let stripped = strip_target_prefix(isa);
    let prefix = &isa[..isa.len() - stripped.len()];
    let target = TargetId::parse(stripped)?;
    let generic = generic_processor(&target.processor)?;
    let mut out = format!("{prefix}{generic}");
    for wanted in ["sramecc", "xnack"] {
        if let Some(feat) = target
            .features
            .iter()
            .find(|f| f.len() == wanted.len() + 1 && f.starts_with(wanted))
        {
            out.push(':');
            out.push_str(feat);
        }
    }
    Some(out)
}

/// The arch list the HIP runtime passes for one device: `[isa, generic(isa)]`, the second only
/// when the processor has a generic target. There is no processor-to-processor fallback.
pub fn device_arch_list(isa: &str) -> Vec<String> {
    let mut list = vec![isa.to_owned()];
    if let Some(generic) = generic_isa(isa) {
        list.push(generic);
    }
    list
}

/// The first `(arch_list entry, candidate)` whose candidate satisfies `available`, walking the
/// list in order and each entry's candidates most specific first. This is the order the loader
/// tries archives in, reused by the mount's fallback links.
pub(crate) fn resolve_in<'a, F>(arch_list: &[String], mut available: F) -> Option<String>
where
    F: FnMut(&str) -> bool + 'a,
{
    arch_list
        .iter()
        .flat_map(|a| compatible_targets(a))
        .find(|candidate| available(candidate))
}

/// Whether code built for one of `arches` runs on the device `device_isa`, by the same rules the
/// loader uses to pick an archive arch (the device's ISA, then its generic target, each with
/// subsets of its features).
pub fn device_can_use(device_isa: &str, arches: &[String]) -> bool {
    resolve_in(&device_arch_list(device_isa), |c| {
        arches.iter().any(|a| a == c)
    })
    .is_some()
}

/// Maps a KFD `gfx_target_version` (M*10000 + m*100 + s) to its processor name `gfx{M}{m:x}{s:x}`.
pub fn processor_from_target_version(version: u64) -> Option<String> {
    if version == 0 {
        return None;
    }
    let major = version / 10000;
    let minor = (version / 100) % 100;
    let step = version % 100;
    Some(format!("gfx{major}{minor:x}{step:x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_uses_its_own_arch_a_feature_subset_or_its_generic_target() {
        let arches = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(device_can_use(
            "gfx942:sramecc+:xnack-",
            &arches(&["gfx90a", "gfx942"])
        ));
        assert!(device_can_use("gfx942:xnack-", &arches(&["gfx942:xnack-"])));
        assert!(!device_can_use(
            "gfx942:xnack-",
            &arches(&["gfx942:xnack+"])
        ));
        assert!(device_can_use("gfx1101", &arches(&["gfx11-generic"])));
        assert!(!device_can_use("gfx1101", &arches(&["gfx1100", "gfx90a"])));
        assert!(!device_can_use("gfx942", &[]));
    }

    #[test]
    fn strips_prefix_only_when_followed_by_something() {
        assert_eq!(strip_target_prefix("amdgcn-amd-amdhsa--gfx900"), "gfx900");
        assert_eq!(
            strip_target_prefix("amdgcn-amd-amdhsa--"),
            "amdgcn-amd-amdhsa--"
        );
        assert_eq!(strip_target_prefix("gfx900"), "gfx900");
        assert_eq!(strip_target_prefix(""), "");
    }

    #[test]
    fn parses_target_ids() {
        let t = TargetId::parse("gfx942:sramecc+::xnack-").unwrap();
        assert_eq!(t.processor, "gfx942");
        assert_eq!(t.features, vec!["sramecc+", "xnack-"]);
        assert_eq!(t.to_string(), "gfx942:sramecc+:xnack-");
        assert!(TargetId::parse("").is_none());
        assert!(TargetId::parse(":xnack+").is_none());
        assert_eq!(
            TargetId::parse("gfx1250-strict").unwrap().processor,
            "gfx1250-strict"
        );
    }

    #[test]
    fn expands_feature_subsets_most_specific_first() {
        assert_eq!(
            compatible_targets("amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-"),
            vec![
                "gfx942:sramecc+:xnack-",
                "gfx942:sramecc+",
                "gfx942:xnack-",
                "gfx942"
            ]
        );
        assert_eq!(
            compatible_targets("gfx942:xnack+"),
            vec!["gfx942:xnack+", "gfx942"]
        );
        assert_eq!(compatible_targets("gfx1201"), vec!["gfx1201"]);
        assert_eq!(compatible_targets("gfx9-4-generic"), vec!["gfx9-4-generic"]);
        assert!(compatible_targets("").is_empty());
        assert_eq!(
            compatible_targets("amdgcn-amd-amdhsa--"),
            vec!["amdgcn-amd-amdhsa--"]
        );
    }

    #[test]
    fn caps_feature_explosion() {
        let name = format!("gfx900{}", ":f+".repeat(40));
        assert_eq!(compatible_targets(&name).len(), 1 << MAX_FEATURES);
    }

    #[test]
    fn generic_table_and_feature_order() {
        assert_eq!(generic_processor("gfx1101"), Some("gfx11-generic"));
        assert_eq!(generic_processor("gfx90a"), None);
        assert_eq!(generic_processor("gfx940"), None);
        assert_eq!(
            generic_isa("amdgcn-amd-amdhsa--gfx942:xnack+:sramecc-").as_deref(),
            Some("amdgcn-amd-amdhsa--gfx9-4-generic:sramecc-:xnack+")
        );
        assert_eq!(generic_isa("gfx1030").as_deref(), Some("gfx10-3-generic"));
        assert_eq!(device_arch_list("gfx908"), vec!["gfx908"]);
        assert_eq!(
            device_arch_list("gfx1250"),
            vec!["gfx1250", "gfx12-5-generic"]
        );
    }

    #[test]
    fn no_processor_to_processor_fallback() {
        let list = device_arch_list("gfx1101");
        let found = resolve_in(&list, |c| c == "gfx1100");
        assert_eq!(found, None);
        assert_eq!(
            resolve_in(&list, |c| c == "gfx11-generic").as_deref(),
            Some("gfx11-generic")
        );
    }

    #[test]
    fn kfd_versions() {
        assert_eq!(
            processor_from_target_version(90010).as_deref(),
            Some("gfx90a")
        );
        assert_eq!(
            processor_from_target_version(110001).as_deref(),
            Some("gfx1101")
        );
        assert_eq!(
            processor_from_target_version(90402).as_deref(),
            Some("gfx942")
        );
        assert_eq!(processor_from_target_version(0), None);
    }
}
