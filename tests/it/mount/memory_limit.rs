//! The daemon in a memory cgroup whose limit is smaller than the kernels it decodes: a full read
//! of every file gives exact bytes, the limit was reached (the cgroup's peak usage came within
//! 1 MiB of it, or it counted refused charges: the test did press on it), and the out-of-memory
//! killer never ran.
//!
//! Works with the v1 memory controller (`memory.limit_in_bytes`, `memory.failcnt`,
//! `memory.oom_control`) and with v2 (`memory.max`, `memory.events`). A machine with neither
//! usable fails the test: it is not skipped.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use rocm_kpack::Compression;

use super::write_archive;
use crate::support::craft::incompressible;
use crate::support::mount::{Mount, fuse_available};

const LIMIT: u64 = 48 << 20;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Version {
    V1,
    V2,
}

/// A memory cgroup made for one test, removed on drop (once its processes are gone).
struct MemCgroup {
    dir: PathBuf,
    version: Version,
}

/// Where the cgroup file systems are mounted: (v1 memory controller, v2 unified hierarchy).
fn cgroup_mounts() -> (Option<PathBuf>, Option<PathBuf>) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let (mut v1, mut v2) = (None, None);
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let at = PathBuf::from(left.split_whitespace().nth(4).unwrap());
        let mut r = right.split_whitespace();
        let fstype = r.next().unwrap_or("");
        let opts = r.nth(1).unwrap_or("");
        if fstype == "cgroup" && opts.split(',').any(|o| o == "memory") {
            v1 = Some(at);
        } else if fstype == "cgroup2" {
            v2 = Some(at);
        }
    }
    (v1, v2)
}

/// This process's cgroup path in hierarchy `id` of /proc/self/cgroup (`memory` for v1, the
/// empty name for v2).
fn own_path(controller: &str) -> String {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    text.lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, names, path) = (f.next()?, f.next()?, f.next()?);
            let hit = if controller.is_empty() {
                names.is_empty()
            } else {
                names.split(',').any(|n| n == controller)
            };
            hit.then(|| path.trim_start_matches('/').to_owned())
        })
        .unwrap_or_default()
}

impl MemCgroup {
    /// A new cgroup below this process's own, limited to `limit` bytes (and no swap where the
    /// controller can say so): v2 where its memory controller is available, else v1.
    fn new(limit: u64) -> MemCgroup {
        let (v1, v2) = cgroup_mounts();
        let name = format!("kpack-it-{}", std::process::id());
        let v2_usable = v2.as_ref().is_some_and(|m| {
            let parent = m.join(own_path(""));
            std::fs::read_to_string(parent.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
        });
        if v2_usable {
            let parent = v2.unwrap().join(own_path(""));
            let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+memory");
            let dir = parent.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            let g = MemCgroup {
                dir,
                version: Version::V2,
            };
            g.write("memory.max", &limit.to_string());
            let _ = std::fs::write(g.dir.join("memory.swap.max"), "0");
            return g;
        }
        let root = v1.unwrap_or_else(|| {
            panic!(
                "no usable memory cgroup controller: neither a v1 memory hierarchy nor a v2 one \
                 with the memory controller is mounted (see /proc/self/mountinfo)"
            )
        });
        let dir = root.join(own_path("memory")).join(name);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create the memory cgroup {}: {e}", dir.display()));
        let g = MemCgroup {
            dir,
            version: Version::V1,
        };
        g.write("memory.limit_in_bytes", &limit.to_string());
        if g.dir.join("memory.memsw.limit_in_bytes").exists() {
            g.write("memory.memsw.limit_in_bytes", &limit.to_string());
        }
        g
    }

    fn write(&self, file: &str, value: &str) {
        std::fs::write(self.dir.join(file), value)
            .unwrap_or_else(|e| panic!("{}/{file} = {value}: {e}", self.dir.display()));
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_else(|e| panic!("{}/{file}: {e}", self.dir.display()))
    }

    /// (times the limit refused a charge, out-of-memory kills, peak usage in bytes if known).
    fn pressure(&self) -> (u64, u64, Option<u64>) {
        let field = |text: &str, name: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or(0)
        };
        match self.version {
            Version::V1 => (
                self.read("memory.failcnt").trim().parse().unwrap(),
                field(&self.read("memory.oom_control"), "oom_kill "),
                self.read("memory.max_usage_in_bytes").trim().parse().ok(),
            ),
            Version::V2 => {
                let events = self.read("memory.events");
                let peak = std::fs::read_to_string(self.dir.join("memory.peak"))
                    .ok()
                    .and_then(|p| p.trim().parse().ok());
                (field(&events, "max "), field(&events, "oom_kill "), peak)
            }
        }
    }

    fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// Mounts `archive` with the daemon started inside `group`.
fn mount_in(group: &MemCgroup, archive: &Path, extra: &[&str]) -> Mount {
    let procs = group.procs_file();
    Mount::start_configured(archive, extra, &move |cmd| {
        let procs = procs.clone();
        // The line telling how the default cache was sized.
        cmd.env("RUST_LOG", "warn,kpack_fuse::cli::mount=info");
        // SAFETY: between fork and exec only an open, a write and a close are done.
        unsafe {
            cmd.pre_exec(move || {
                let mut f = std::fs::OpenOptions::new().write(true).open(&procs)?;
                f.write_all(b"0")
            });
        }
    })
}

/// 40 kernels of 4 MiB (160 MiB decoded), compressible, so the archive is small but every
/// kernel's decoded bytes are unique.
fn big_set(dir: &Path) -> PathBuf {
    let kernels: Vec<(String, Vec<u8>)> = (0..40u64)
        .map(|i| {
            let seed = incompressible(700 + i, 4096);
            let bytes: Vec<u8> = (0..1024u32)
                .flat_map(|r| seed.iter().map(move |b| b.wrapping_add(r as u8)))
                .collect();
            (format!("lib/libm{}.so#0", i / 2), bytes)
        })
        .collect();
    let list: Vec<(&str, &str, Vec<u8>)> = kernels
        .iter()
        .enumerate()
        .map(|(i, (k, b))| (k.as_str(), ["gfx942", "gfx90a"][i % 2], b.clone()))
        .collect();
    write_archive(
        &dir.join("big.kpack"),
        Compression::Zstd { level: 1 },
        &list,
    )
}

#[test]
fn a_mount_in_a_memory_cgroup_smaller_than_its_kernels_reads_them_all() {
    if !fuse_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let archive = big_set(d.path());
    let want = d.path().join("want");
    super::crash_cache::expected_tree(&archive, &want);
    let scratch = d.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let scratch_arg = scratch.to_str().unwrap();
    let configs: [(&str, Vec<&str>); 3] = [
        (
            "disk backing, passthrough",
            vec!["--scratch-dir", scratch_arg, "--open-mode", "daemon"],
        ),
        (
            "disk backing, page cache",
            vec!["--scratch-dir", scratch_arg, "--open-mode", "page-cache"],
        ),
        // Memfds cannot be reclaimed: the default --memory-cache-size must fit under the limit.
        ("memory backing", vec!["--backing", "memory"]),
    ];
    for (what, args) in configs {
        let group = MemCgroup::new(LIMIT);
        let mut m = mount_in(&group, &archive, &args);
        let procs = group.read("cgroup.procs");
        assert!(
            procs
                .lines()
                .any(|p| p.trim() == m.daemon_pid().to_string()),
            "the daemon is in {}: {procs}",
            group.dir.display()
        );
        m.check("crash_reads", &format!("1|{}|3|strict", want.display()));
        assert!(
            m.daemon_running(),
            "{what}: the daemon died:\n{}",
            m.daemon_log()
        );
        let (failcnt, oom_kills, peak) = group.pressure();
        let log = m.daemon_log();
        m.stop();
        assert_eq!(oom_kills, 0, "{what}: the OOM killer ran in the cgroup");
        let reached = failcnt > 0 || peak.is_some_and(|p| p + (1 << 20) >= LIMIT);
        if what.starts_with("memory") {
            let sized = format!(
                "--memory-cache-size defaults to {} bytes: a quarter of the cgroup's memory limit of {LIMIT}",
                LIMIT / 4
            );
            assert!(log.contains(&sized), "{what}: {log}");
        } else {
            assert!(
                reached,
                "{what}: the limit of {LIMIT} bytes was never reached (peak {peak:?}): the test \
             would not show anything"
            );
        }
        eprintln!(
            "{what} ({:?}): 160 MiB decoded under a {} MiB limit: all exact, refused charges \
             {failcnt}, peak {:?} MiB, 0 OOM kills",
            group.version,
            LIMIT >> 20,
            peak.map(|p| p >> 20)
        );
    }
}
