//! A synthetic fat ROCm host library of any size, laid out like real ones: one offload bundle
//! per translation unit in `.hip_fatbin` (each with a host entry and several arches), one
//! wrapper per bundle in `.hipFatBinSegment` set by a dynamic relocation, built by gcc, with
//! code objects from 20 KB to 15 MB whose bytes compress about 6:1 at zstd level 3, like the
//! code objects of ROCm libraries. Used by the memory-bound test of `split` and by
//! `benches/split.rs` (included there by path, beside `bundles.rs`, as `super::bundles`).
//!
//! The device code is generated one bundle at a time and handed to the assembler as files, so
//! building a 1.2 GB library needs disk, not memory, on our side.

#![allow(dead_code)] // The test and the benchmark use different parts.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::bundles::build_uncompressed;

/// Arches of each bundle, as in real multi-arch ROCm builds.
pub const ARCHES: [&str; 5] = ["gfx90a:xnack-", "gfx942", "gfx1030", "gfx1100", "gfx1201"];

/// Smallest and largest code object.
pub const MIN_CODE_OBJECT: usize = 20 << 10;
pub const MAX_CODE_OBJECT: usize = 15 << 20;

/// Deterministic pseudo-random numbers (xorshift64*), shared by the tests that want fixed-seed
/// shapes and contents (also `roundtrip.rs`, `interop.rs`).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Bytes that compress a little, like code: runs and noise mixed.
    pub fn kernel(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            if self.below(3) == 0 {
                let b = self.next() as u8;
                let run = 1 + self.below(64) as usize;
                out.extend(std::iter::repeat_n(b, run));
            } else {
                out.extend_from_slice(&self.next().to_le_bytes());
            }
        }
        out.truncate(len);
        out
    }
}

/// Code-object-like bytes: 4-byte instructions from a small vocabulary, an operand word now
/// and then, and runs of zeros (padding, empty tables), which zstd-3 compresses about 6:1.
pub fn code_object(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let vocab: Vec<u32> = (0..16).map(|_| rng.next() as u32).collect();
    let mut out = Vec::with_capacity(len + 512);
    while out.len() < len {
        let r = rng.next();
        out.extend_from_slice(&vocab[(r % 16) as usize].to_le_bytes());
        if r & 0x1f00 == 0 {
            out.extend_from_slice(&((r >> 32) as u32).to_le_bytes());
        }
        if r & 0x7_f000 == 0 {
            out.resize(out.len() + 256, 0);
        }
    }
    out.truncate(len);
    out
}

/// The code object sizes of `bundles` bundles of [`ARCHES`], adding up to about `total` bytes:
/// a log-uniform size per translation unit (scaled to the total, clamped to 20 KB..15 MB), each
/// arch within 20 % of it.
pub fn sizes(total: u64, bundles: usize, seed: u64) -> Vec<Vec<usize>> {
    let mut rng = Rng::new(seed);
    let unit = |rng: &mut Rng| (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
    let (lo, hi) = ((MIN_CODE_OBJECT as f64).ln(), (MAX_CODE_OBJECT as f64).ln());
    let tus: Vec<f64> = (0..bundles)
        .map(|_| (lo + (hi - lo) * unit(&mut rng)).exp())
        .collect();
    let raw: f64 = tus.iter().sum::<f64>() * ARCHES.len() as f64;
    let scale = total as f64 / raw;
    tus.iter()
        .map(|tu| {
            ARCHES
                .iter()
                .map(|_| {
                    let s = tu * scale * (0.8 + 0.4 * unit(&mut rng));
                    (s as usize).clamp(MIN_CODE_OBJECT, MAX_CODE_OBJECT)
                })
                .collect()
        })
        .collect()
}

/// What was built.
pub struct FatHost {
    pub path: PathBuf,
    /// Code objects in bundle order: (arch, bytes) generated from (seed, size).
    pub code_objects: Vec<(&'static str, u64, usize)>,
    pub device_bytes: u64,
}

impl FatHost {
    /// Regenerates code object `i` (so callers need not keep them in memory).
    pub fn code_object(&self, i: usize) -> Vec<u8> {
        let (_, seed, len) = self.code_objects[i];
        code_object(seed, len)
    }
}

/// Builds `dir/name` (a shared library) with about `total` bytes of device code in `bundles`
/// bundles. Scratch files (one per bundle) are removed once gcc is done.
pub fn build(dir: &Path, name: &str, total: u64, bundles: usize, seed: u64) -> FatHost {
    let scratch = dir.join(format!("{name}.parts"));
    std::fs::create_dir_all(&scratch).unwrap();
    let mut asm = String::from(".section .hip_fatbin,\\\"a\\\",@progbits\\n");
    let mut decls = String::new();
    let mut wrappers = String::new();
    let mut code_objects = Vec::new();
    let mut device_bytes = 0u64;
    for (b, arch_sizes) in sizes(total, bundles, seed).into_iter().enumerate() {
        let objects: Vec<(String, Vec<u8>)> = ARCHES
            .iter()
            .zip(arch_sizes)
            .enumerate()
            .map(|(a, (arch, len))| {
                let s = seed ^ ((b as u64) << 20 | a as u64);
                code_objects.push((*arch, s, len));
                device_bytes += len as u64;
                (
                    format!("hipv4-amdgcn-amd-amdhsa--{arch}"),
                    code_object(s, len),
                )
            })
            .collect();
        let mut entries: Vec<(&str, &[u8])> = vec![("host-x86_64-unknown-linux-gnu", &[])];
        entries.extend(objects.iter().map(|(t, d)| (t.as_str(), d.as_slice())));
        let part = scratch.join(format!("tu{b}"));
        std::fs::write(&part, build_uncompressed(&entries, 4096)).unwrap();
        asm.push_str(&format!(
            ".p2align 12\\nkp_tu{b}:\\n.incbin \\\"{}\\\"\\n",
            part.display()
        ));
        decls.push_str(&format!("extern const unsigned char kp_tu{b}[];\n"));
        wrappers.push_str(&format!("{{ 0x48495046u, 1u, kp_tu{b}, 0ull }},"));
    }
    asm.push_str(".previous\\n");
    let c = format!(
        "__asm__(\"{asm}\");\n{decls}\
         struct wrapper {{ unsigned int magic; unsigned int version; const void *binary; unsigned long long reserved1; }};\n\
         __attribute__((section(\".hipFatBinSegment\"), used, aligned(8))) struct wrapper hip_wrappers[] = {{ {wrappers} }};\n\
         int host_function(int x) {{ return x * 3 + 1; }}\n"
    );
    let c_path = scratch.join("host.c");
    std::fs::write(&c_path, c).unwrap();
    let path = dir.join(name);
    let o = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&path)
        .arg(&c_path)
        .output()
        .expect("gcc must be installed");
    assert!(
        o.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::remove_dir_all(&scratch).unwrap();
    FatHost {
        path,
        code_objects,
        device_bytes,
    }
}

/// Peak resident memory (VmHWM, from `wait4`'s `ru_maxrss`) of a command run to completion, in
/// bytes, with its exit status. The figure is at least the peak RSS of the calling process
/// (Linux folds the replaced address space's high-water mark in at exec), so call it from a
/// small process: `split_memory` runs it in a fresh copy of the test binary.
pub fn peak_rss(cmd: &mut Command) -> (std::process::ExitStatus, u64) {
    let (status, peak, _) = run_measured(cmd);
    (status, peak)
}

/// [`peak_rss`], with the CPU time (user + system) the command used.
pub fn run_measured(cmd: &mut Command) -> (std::process::ExitStatus, u64, std::time::Duration) {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    // A pre-exec hook makes the standard library fork instead of vfork: with vfork the child's
    // ru_maxrss would start from this process's own peak (the mm it borrowed until exec); after
    // fork it starts from this process's current size, which is small when this is called.
    // SAFETY: the hook does nothing, so it is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| Ok(()));
    }
    let child = cmd.spawn().expect("spawn");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not yet waited for (the Child handle never waits: it is
    // forgotten below); status and usage point at locals.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    std::mem::forget(child);
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (
        std::process::ExitStatus::from_raw(status),
        usage.ru_maxrss as u64 * 1024,
        std::time::Duration::from_secs_f64(secs(usage.ru_utime) + secs(usage.ru_stime)),
    )
}
