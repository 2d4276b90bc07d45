//! Which GPUs an `oci://` source is read for (`--gpu ARCH`, `--gpu auto`), and whether a layer
//! serves them, by the loader's target-ID rules (`host::target_id`).

use std::path::Path;

use rocm_kpack::fs::setup::gpus;
use rocm_kpack::host::target_id;

/// The `--gpu` value that stands for the node's own GPUs.
pub const AUTO: &str = "auto";

/// The GPUs that `--gpu` values name, `auto` replaced by the GPUs the KFD topology under `kfd`
/// reports (in node order, after any named before it), without duplicates. `None` when no
/// `--gpu` was given: every layer is read.
pub fn wanted_gpus(values: &[String], kfd: &Path) -> Result<Option<Vec<String>>, String> {
    if values.is_empty() {
        return Ok(None);
    }
    let mut out: Vec<String> = Vec::new();
    for v in values {
        let found = if v == AUTO {
            let local = gpus::local_gpus(kfd);
            if local.is_empty() {
                return Err(format!(
                    "--gpu auto: this node has no GPU (no node under {} reports a \
                     gfx_target_version); name the GPUs with --gpu ARCH",
                    kfd.display()
                ));
            }
            local
        } else if target_id::TargetId::parse(v).is_some_and(|t| t.processor.starts_with("gfx")) {
            vec![v.clone()]
        } else {
            return Err(format!(
                "--gpu {v:?}: not a GPU target (gfx942, gfx942:xnack-, gfx11-generic) or auto"
            ));
        };
        for g in found {
            if !out.contains(&g) {
                out.push(g);
            }
        }
    }
    Ok(Some(out))
}

/// Whether a layer whose archive holds `arches` has code for one of `gpus`.
pub fn serves(gpus: &[String], arches: &[String]) -> bool {
    gpus.iter().any(|g| target_id::device_can_use(g, arches))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn no_gpu_means_every_layer() {
        assert_eq!(wanted_gpus(&[], Path::new("/nonexistent")), Ok(None));
    }

    #[test]
    fn auto_reads_the_kfd_topology_and_fails_without_a_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let err = wanted_gpus(&strings(&["auto"]), dir.path()).unwrap_err();
        assert!(err.starts_with("--gpu auto: this node has no GPU"), "{err}");
        for (node, version) in [(0, 0u64), (1, 90402), (2, 110001)] {
            let p = dir.path().join(node.to_string());
            std::fs::create_dir(&p).unwrap();
            std::fs::write(
                p.join("properties"),
                format!("gfx_target_version {version}\n"),
            )
            .unwrap();
        }
        assert_eq!(
            wanted_gpus(&strings(&["gfx1101", "auto"]), dir.path()),
            Ok(Some(strings(&["gfx1101", "gfx942"])))
        );
    }

    #[test]
    fn refuses_what_is_not_a_gpu_target() {
        for bad in ["", "x86_64", ":xnack+"] {
            let err = wanted_gpus(&strings(&[bad]), Path::new("/nonexistent")).unwrap_err();
            assert!(err.contains("not a GPU target"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn a_layer_serves_a_gpu_by_target_id_matching() {
        let layer = strings(&["gfx90a", "gfx942"]);
        assert!(serves(&strings(&["gfx942:sramecc+:xnack-"]), &layer));
        assert!(!serves(&strings(&["gfx1100"]), &layer));
        assert!(serves(&strings(&["gfx1100", "gfx90a"]), &layer));
        assert!(serves(&strings(&["gfx1101"]), &strings(&["gfx11-generic"])));
    }
}
