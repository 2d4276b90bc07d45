//! The local GPUs, as the KFD driver reports them: each topology node's `properties` file has a
//! `gfx_target_version` line (0 for CPU nodes) that `target_id::processor_from_target_version` turns
//! into a processor name. Used for `native.hsaco` when no `--gpu` is given.

use std::path::Path;

use crate::host::target_id;

/// The default KFD topology directory.
pub const KFD_NODES: &str = "/sys/class/kfd/kfd/topology/nodes";

/// The GPU processors under `nodes_dir`, in node order, without duplicates. A missing or
/// unreadable directory means no GPUs.
pub fn local_gpus(nodes_dir: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(nodes_dir) else {
        return Vec::new();
    };
    let mut nodes: Vec<(u64, std::path::PathBuf)> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path())))
        .collect();
    nodes.sort();
    let mut out: Vec<String> = Vec::new();
    for (_, node) in nodes {
        let Ok(text) = std::fs::read_to_string(node.join("properties")) else {
            continue;
        };
        let version = text.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next()? == "gfx_target_version").then(|| it.next()?.parse::<u64>().ok())?
        });
        if let Some(name) = version.and_then(target_id::processor_from_target_version) {
            if !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_gpu_nodes_in_order_and_skips_cpus() {
        let dir = tempfile::tempdir().unwrap();
        for (node, version) in [(0, 0u64), (2, 110001), (1, 90010), (10, 90010)] {
            let p = dir.path().join(node.to_string());
            std::fs::create_dir(&p).unwrap();
            std::fs::write(
                p.join("properties"),
                format!("cpu_cores_count 4\ngfx_target_version {version}\n"),
            )
            .unwrap();
        }
        assert_eq!(local_gpus(dir.path()), vec!["gfx90a", "gfx1101"]);
        assert!(local_gpus(&dir.path().join("missing")).is_empty());
    }
}
