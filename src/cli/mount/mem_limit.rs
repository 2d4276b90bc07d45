//! The memory limit of this process's cgroup, for defaults that hold memory: the lowest of
//! `memory.max` (cgroup v2) or `memory.limit_in_bytes` (v1) of its cgroup and every ancestor.
//! A daemon that keeps more than that in memfds (which cannot be reclaimed) is killed by the
//! out-of-memory killer, so `--backing memory` sizes its default cache from it.

use std::path::{Path, PathBuf};

/// v1 reports "no limit" as a huge page-aligned number; anything from here up is no limit.
const V1_UNLIMITED: u64 = 1 << 60;

/// The limit in bytes, or `None` when there is none (or no memory controller to tell).
pub fn cgroup_memory_limit() -> Option<u64> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    limit_files(&mountinfo, &cgroup)
        .iter()
        .filter_map(|f| parse_limit(&std::fs::read_to_string(f).ok()?))
        .min()
}

/// A limit file's value: bytes, or `None` for `max` and v1's "unlimited".
fn parse_limit(text: &str) -> Option<u64> {
    text.trim().parse().ok().filter(|v| *v < V1_UNLIMITED)
}

/// Every limit file that applies to this process: its cgroup's and each ancestor's, in the v2
/// hierarchy and in a v1 hierarchy with the memory controller.
fn limit_files(mountinfo: &str, cgroup: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split_whitespace().collect();
        let (Some(root), Some(at)) = (fields.get(3), fields.get(4)) else {
            continue;
        };
        let mut r = right.split_whitespace();
        let fstype = r.next().unwrap_or("");
        let options = r.nth(1).unwrap_or("");
        let (controller, file) = match fstype {
            "cgroup2" => ("", "memory.max"),
            "cgroup" if options.split(',').any(|o| o == "memory") => {
                ("memory", "memory.limit_in_bytes")
            }
            _ => continue,
        };
        let Some(path) = own_path(cgroup, controller) else {
            continue;
        };
        // The mount shows the hierarchy from `root` down; the process's path is absolute.
        let Some(below) = Path::new(path).strip_prefix(root).ok() else {
            continue;
        };
        let mount = Path::new(at);
        let mut dir = mount.join(below);
        loop {
            out.push(dir.join(file));
            if dir == mount || !dir.pop() || !dir.starts_with(mount) {
                break;
            }
        }
    }
    out
}

/// This process's path in the hierarchy of `controller` (`""`: the v2 one) in
/// /proc/self/cgroup's text.
fn own_path<'a>(cgroup: &'a str, controller: &str) -> Option<&'a str> {
    cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, names, path) = (f.next()?, f.next()?, f.next()?);
        let hit = if controller.is_empty() {
            names.is_empty()
        } else {
            names.split(',').any(|n| n == controller)
        };
        hit.then_some(path)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/cpu rw,relatime shared:10 - cgroup cgroup rw,cpu
32 25 0:28 / /sys/fs/cgroup/unified rw,relatime shared:11 - cgroup2 cgroup2 rw
33 25 0:29 /jobs /sys/fs/cgroup/inner rw,relatime - cgroup2 cgroup2 rw
";
    const CGROUP: &str = "\
5:cpu:/
4:memory:/a/b
0::/jobs/x
";

    #[test]
    fn limit_files_cover_the_cgroup_and_its_ancestors_in_both_versions() {
        let files = limit_files(MOUNTINFO, CGROUP);
        let want = [
            "/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/a/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/unified/jobs/x/memory.max",
            "/sys/fs/cgroup/unified/jobs/memory.max",
            "/sys/fs/cgroup/unified/memory.max",
            "/sys/fs/cgroup/inner/x/memory.max",
            "/sys/fs/cgroup/inner/memory.max",
        ];
        assert_eq!(files, want.map(PathBuf::from));
    }

    #[test]
    fn unlimited_values_are_no_limit() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("50331648\n"), Some(48 << 20));
        assert_eq!(parse_limit(""), None);
    }
}
