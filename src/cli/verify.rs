//! `kpack-fuse verify`: decode every kernel (a worker per core), check every size, name and
//! recorded BLAKE3 digest, and name each bad entry.
//! With `--against HOST` (repeatable), also check that the archives hold every code object of those fat
//! binaries byte for byte.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use rocm_kpack::archive::format::TocEntry;
use rocm_kpack::{Archive, Scheme, names};

use super::import;
use crate::cli::exit::{CliError, CliResult, Exit};
use crate::cli::out::{errln, outln};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The archives to check.
    #[arg(required_unless_present = "split")]
    pub archives: Vec<PathBuf>,
    /// A ROCm host binary whose .hip_fatbin code objects must all be in the archives; repeat the
    /// option for several binaries (it takes one value, so archives may follow it).
    #[arg(long, value_name = "HOST")]
    pub against: Vec<PathBuf>,
    /// Check a tree written by `split`: every rewritten binary's code objects must load and match
    /// the original binary's byte for byte.
    #[arg(long, value_name = "OUTROOT", requires = "original")]
    pub split: Option<PathBuf>,
    /// With --split: the root the original (fat) binaries are under.
    #[arg(long, value_name = "ROOT", requires = "split")]
    pub original: Option<PathBuf>,
    /// For oci:// artifacts: check only the layers with code for this GPU (repeatable; auto:
    /// this node's GPUs).
    #[arg(long = "gpu", value_name = "ARCH")]
    pub gpus: Vec<String>,
    #[command(flatten)]
    pub remote: super::remote_args::RemoteArgs,
}

pub fn run(args: Args) -> CliResult {
    if let (Some(out_root), Some(original)) = (&args.split, &args.original) {
        super::split::verify_tree(out_root, original)?;
        if args.archives.is_empty() {
            return Ok(());
        }
    }
    let mut problems = Vec::new();
    let mut total = 0usize;
    let mut digested = Digested::default();
    let mut opened = 0usize;
    // Said only when everything verified: next to BAD lines it would be noise.
    let mut undigested = Vec::new();
    for path in &args.archives {
        for archive in super::remote_args::open_archives(path, &args.remote, &args.gpus, true)? {
            let (n, d) = check(&archive, &mut problems);
            if d.kernel + d.frame_only == 0 && n != 0 {
                undigested.push(archive.path().to_path_buf());
            }
            total += n;
            digested.kernel += d.kernel;
            digested.frame_only += d.frame_only;
            opened += 1;
        }
    }
    for p in &problems {
        errln!("BAD {p}");
    }
    if !problems.is_empty() {
        return Err(CliError::new(
            Exit::Corrupt,
            format!(
                "{} of {} bad",
                problems.len(),
                super::plural::count_of(total, "entry is", "entries are")
            ),
        ));
    }
    for path in undigested {
        outln!(
            "{}: has no BLAKE3 digests (written by the reference tooling or with \
             --reference-layout); checked by sizes only",
            path.display()
        )?;
    }
    let how = digested.say(total);
    outln!(
        "ok: {} in {}, {how}",
        super::plural::count_of(total, "kernel", "kernels"),
        super::plural::count_of(opened, "archive", "archives")
    )?;
    if !args.against.is_empty() {
        import::verify_against(&args.archives, &args.against)?;
    }
    Ok(())
}

/// How many entries had which digest checked.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Digested {
    /// With a `blake3` digest of the decoded kernel (and maybe a frame digest, checked too).
    kernel: usize,
    /// With only a `frame_blake3` digest: the frame is checked, the decoded bytes by size.
    frame_only: usize,
}

impl Digested {
    fn of(entry: &TocEntry<'_>) -> Digested {
        let kernel = entry.blake3_at.is_some();
        Digested {
            kernel: usize::from(kernel),
            frame_only: usize::from(!kernel && entry.frame_blake3_at.is_some()),
        }
    }

    /// What was checked of `total` kernels, for the closing line.
    fn say(self, total: usize) -> String {
        let Digested { kernel, frame_only } = self;
        let base = "each decoded to its recorded size";
        if kernel == total {
            return format!("{base} and BLAKE3 digest");
        }
        if frame_only == total {
            return format!("{base}, its frame to its BLAKE3 digest");
        }
        if kernel + frame_only == 0 {
            return format!("{base} (no digests to check)");
        }
        let mut parts = vec![base.to_owned()];
        if kernel != 0 {
            parts.push(format!("{kernel} of them also to their BLAKE3 digest"));
        }
        if frame_only != 0 {
            parts.push(format!(
                "{frame_only} only their frame to its BLAKE3 digest"
            ));
        }
        parts.join(", ")
    }
}

/// Checks every entry (decoding it checks its frame's and its own digest, when recorded) on a
/// worker per core; returns how many entries there were and which digests they had, and appends
/// a line per problem, in TOC order whatever the threads.
fn check(archive: &Archive, problems: &mut Vec<String>) -> (usize, Digested) {
    let entries: Vec<_> = archive.indexed_entries().collect();
    let mut digested = Digested::default();
    for (_, _, e) in &entries {
        let d = Digested::of(e);
        digested.kernel += d.kernel;
        digested.frame_only += d.frame_only;
    }
    // Looked up once per entry: a set, so that many arches cost no quadratic search.
    let listed: HashSet<&str> = archive.architectures().iter().map(String::as_str).collect();
    let bar = super::progress::bar(entries.iter().map(|(_, _, e)| e.original_size).sum());
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(entries.len().max(1));
    let next = AtomicUsize::new(0);
    let mut found: Vec<(usize, Vec<String>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut found = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(at, key, entry)) = entries.get(i) else {
                            return found;
                        };
                        let bad = check_entry(archive, &listed, at, key, &entry);
                        if !bad.is_empty() {
                            found.push((i, bad));
                        }
                        if let Some(b) = &bar {
                            b.inc(entry.original_size);
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    found.sort_by_key(|(i, _)| *i);
    problems.extend(found.into_iter().flat_map(|(_, bad)| bad));
    (entries.len(), digested)
}

/// The problems of one entry, as `BAD` lines without the prefix.
fn check_entry(
    archive: &Archive,
    listed: &HashSet<&str>,
    (b, e): (usize, usize),
    key: &str,
    entry: &TocEntry<'_>,
) -> Vec<String> {
    let file = archive.path().display();
    let arch = entry.arch;
    let mut problems = Vec::new();
    let mut bad = |why: String| problems.push(format!("{file}: {key} [{arch}]: {why}"));
    if let Err(e) = names::key_components(key) {
        bad(e);
    }
    if let Err(e) = names::check_arch(arch) {
        bad(e);
    }
    if !listed.contains(arch) {
        bad("arch is missing from gfx_arches, so the loader can never find this kernel".into());
    }
    let kref = match archive.locate_at(b, e) {
        Ok(k) => k,
        Err(e) => {
            bad(e.reason());
            return problems;
        }
    };
    if archive.scheme() == Scheme::None && kref.stored.size != entry.original_size {
        bad(format!(
            "original_size {} differs from the stored size {}",
            entry.original_size, kref.stored.size
        ));
    }
    if let Err(e) = archive.verify_kernel(&kref) {
        bad(e.reason());
    }
    problems
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::commands::{Cli, Command};

    fn parse(args: &[&str]) -> super::Args {
        let mut argv = vec!["kpack-fuse", "verify"];
        argv.extend(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Verify(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_closing_line_says_which_digests_were_checked() {
        let say = |kernel, frame_only, total| super::Digested { kernel, frame_only }.say(total);
        let base = "each decoded to its recorded size";
        assert_eq!(say(4, 0, 4), format!("{base} and BLAKE3 digest"));
        assert_eq!(
            say(0, 4, 4),
            format!("{base}, its frame to its BLAKE3 digest")
        );
        assert_eq!(say(0, 0, 4), format!("{base} (no digests to check)"));
        assert_eq!(
            say(1, 2, 4),
            format!(
                "{base}, 1 of them also to their BLAKE3 digest, 2 only their frame to its BLAKE3 \
                 digest"
            )
        );
        assert_eq!(
            say(0, 3, 4),
            format!("{base}, 3 only their frame to its BLAKE3 digest")
        );
    }

    #[test]
    fn against_takes_one_host_per_use() {
        let a = parse(&["--against", "lib/libfoo.so", "foo_gfx900.kpack"]);
        assert_eq!(a.against, ["lib/libfoo.so"].map(std::path::PathBuf::from));
        assert_eq!(
            a.archives,
            ["foo_gfx900.kpack"].map(std::path::PathBuf::from)
        );
        let a = parse(&[
            "a.kpack",
            "--against",
            "lib/libfoo.so",
            "b.kpack",
            "--against",
            "bin/app",
        ]);
        assert_eq!(
            a.against,
            ["lib/libfoo.so", "bin/app"].map(std::path::PathBuf::from)
        );
        assert_eq!(
            a.archives,
            ["a.kpack", "b.kpack"].map(std::path::PathBuf::from)
        );
    }
}
