//! `target_id`: arbitrary text as an agent ISA / target ID.
//!
//! Invariants: nothing panics; `compatible_targets` yields at most 2^MAX_FEATURES distinct-shaped
//! candidates, the first being the parsed input (prefix stripped, empty feature pieces dropped,
//! features cut to MAX_FEATURES) and the last the bare processor, each candidate keeping the
//! features in input order; `generic_isa` keeps the triple prefix, maps to a `-generic`
//! processor, adds only features the input had, and is not itself generic-mapped again;
//! `device_arch_list` is the ISA plus at most its generic.

use rocm_kpack::host::target_id::{self, MAX_FEATURES, TargetId};

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let isa = text.as_ref();
    let stripped = target_id::strip_target_prefix(isa);
    assert!(isa.ends_with(stripped));
    let candidates = target_id::compatible_targets(isa);
    assert!(candidates.len() <= 1 << MAX_FEATURES);
    match TargetId::parse(stripped) {
        None => assert!(
            candidates.is_empty(),
            "unparsable {stripped:?} gave {candidates:?}"
        ),
        Some(target) => {
            let kept = &target.features[..target.features.len().min(MAX_FEATURES)];
            assert_eq!(candidates.len(), 1 << kept.len());
            let full = TargetId {
                processor: target.processor.clone(),
                features: kept.to_vec(),
            };
            assert_eq!(candidates[0], full.to_string());
            if kept.len() == target.features.len()
                && !stripped.contains("::")
                && !stripped.ends_with(':')
            {
                assert_eq!(
                    candidates[0], stripped,
                    "first candidate is not the input itself"
                );
            }
            assert_eq!(candidates.last(), Some(&target.processor));
            for c in &candidates {
                let parsed = TargetId::parse(c).expect("candidate parses");
                assert_eq!(parsed.processor, target.processor);
                assert!(
                    is_subsequence(&parsed.features, kept),
                    "{c:?} reorders {kept:?}"
                );
            }
        }
    }

    if let Some(generic) = target_id::generic_isa(isa) {
        let prefix = &isa[..isa.len() - stripped.len()];
        assert!(generic.starts_with(prefix));
        let g = TargetId::parse(&generic[prefix.len()..]).expect("generic parses");
        assert!(g.processor.ends_with("-generic"), "{generic:?}");
        let input = TargetId::parse(stripped).expect("input parsed");
        assert!(
            g.features.iter().all(|f| input.features.contains(f)),
            "{generic:?} invents features"
        );
        assert_eq!(
            target_id::generic_isa(&generic),
            None,
            "{generic:?} maps again"
        );
    }
    let list = target_id::device_arch_list(isa);
    assert!(matches!(list.len(), 1 | 2) && list[0] == isa);

    // The KFD version decoder takes any number; only its shape is checked.
    if data.len() >= 8 {
        let version = u64::from_le_bytes(data[..8].try_into().unwrap());
        match target_id::processor_from_target_version(version) {
            None => assert_eq!(version, 0),
            Some(name) => assert!(name.starts_with("gfx") && name.len() > 3),
        }
    }
}

fn is_subsequence(part: &[String], whole: &[String]) -> bool {
    let mut it = whole.iter();
    part.iter().all(|p| it.any(|w| w == p))
}
