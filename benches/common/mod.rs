//! Shared by the benchmark targets: synthetic code-like kernels and timing helpers.

#![allow(dead_code)] // Each benchmark target uses its own subset.

use std::time::Duration;

use rocm_kpack::Archive;

/// Every frame of `archive` read into memory, each with the size it decodes to: what a
/// plain-zstd baseline decodes, with no file I/O in its time.
pub fn frames_in_memory(archive: &Archive) -> Vec<(Vec<u8>, usize)> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(archive.path()).unwrap();
    archive
        .entries()
        .map(|(key, e)| {
            let r = archive.locate(key, e.arch).unwrap();
            let mut frame = vec![0u8; r.stored.size as usize];
            file.read_exact_at(&mut frame, r.stored.offset).unwrap();
            (frame, r.size as usize)
        })
        .collect()
}

/// Cheap filler bytes: 4-byte words from a small vocabulary with random operands (zstd-3 makes
/// them about 2x smaller). For benchmarks where only sizes and counts matter (TOC scale, remote
/// request counts); decoding benchmarks use [`CodeLike`], which compresses like real code.
pub fn kernel_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let vocab: Vec<u32> = (0..64).map(|_| next() as u32).collect();
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        let r = next();
        out.extend_from_slice(&vocab[(r % 64) as usize].to_le_bytes());
        if r & 0x300 == 0 {
            out.extend_from_slice(&((r >> 32) as u32).to_le_bytes());
        }
    }
    out.truncate(len);
    out
}

/// Code-like synthetic kernels that compress and decode like real AMDGPU code objects: zstd-3
/// makes them about 6x smaller, as it does a real ROCm library's code objects (Debian's
/// rocRAND, built for older GPUs too, is 4.4x). Four words of each block are changed: fewer
/// would make the data compress further and decode faster than real code. A library has a
/// vocabulary of 4-byte words and a dictionary of instruction blocks built from it (with random
/// operands); a kernel is blocks drawn with a skew towards common ones, a few words of each
/// changed, and runs of zero padding.
pub struct CodeLike {
    x: u64,
    blocks: Vec<Vec<u8>>,
}

impl CodeLike {
    /// A generator whose first library is built from `seed`.
    pub fn new(seed: u64) -> CodeLike {
        let mut g = CodeLike {
            x: seed | 1,
            blocks: Vec::new(),
        };
        g.new_library();
        g
    }

    /// The next pseudo-random word (xorshift).
    pub fn next(&mut self) -> u64 {
        self.x ^= self.x << 13;
        self.x ^= self.x >> 7;
        self.x ^= self.x << 17;
        self.x
    }

    /// Starts a new library: a fresh vocabulary and block dictionary for the kernels that follow.
    pub fn new_library(&mut self) {
        let vocab: Vec<[u8; 4]> = (0..96)
            .map(|_| (self.next() as u32).to_le_bytes())
            .collect();
        self.blocks = (0..1024)
            .map(|_| {
                let words = 8 + self.next() % 41;
                let mut b = Vec::new();
                for _ in 0..words {
                    b.extend_from_slice(&vocab[skewed(self.next(), 1.2, 96)]);
                    if self.next() % 10 < 3 {
                        b.extend_from_slice(&(self.next() as u32).to_le_bytes());
                    }
                }
                b
            })
            .collect();
    }

    /// One kernel of exactly `len` bytes from the current library.
    pub fn kernel(&mut self, len: usize) -> Vec<u8> {
        let mut data = Vec::with_capacity(len + 8192);
        while data.len() < len {
            if self.next() % 100 < 3 {
                let pad = 64 + (self.next() % 1985) as usize;
                data.resize(data.len() + pad, 0);
                continue;
            }
            let pick = skewed(self.next(), 0.8, self.blocks.len());
            let mut blk = self.blocks[pick].clone();
            for _ in 0..4 {
                let at = (self.next() as usize % (blk.len() / 4)) * 4;
                blk[at..at + 4].copy_from_slice(&(self.next() as u32).to_le_bytes());
            }
            data.extend_from_slice(&blk);
        }
        data.truncate(len);
        data
    }
}

/// A heavy-tailed index below `n`: small values are the common blocks and words.
fn skewed(r: u64, shape: f64, n: usize) -> usize {
    let u = (r >> 11) as f64 / (1u64 << 53) as f64;
    ((1.0 / (1.0 - u).powf(1.0 / shape)) as usize) % n
}

/// The fastest of `runs` timings: the run least disturbed by the rest of the machine.
pub fn best_of<F: FnMut() -> Duration>(runs: usize, mut f: F) -> Duration {
    (0..runs).map(|_| f()).min().expect("at least one run")
}

/// What a comparison is against, as printed: a smoke run (`--quick`) is not a measurement, so
/// it states no target and passes no verdict (a trailing "(target ...)" is left out).
pub fn against_for_print(against: &str, quick: bool) -> String {
    match against.find("(target") {
        Some(at) if quick => against[..at].trim_end().to_owned(),
        _ => against.to_owned(),
    }
}

/// Timings of several contenders measured in turn, round after round. On a VM whose host takes
/// time away in bursts, the best of separate series compares two different machines; timings
/// taken next to each other in one round see the same one, so ratios are taken within a round
/// and the median of those is reported.
pub struct Rounds {
    times: Vec<Vec<Duration>>,
}

impl Rounds {
    pub fn new(contenders: usize) -> Rounds {
        Rounds {
            times: vec![Vec::new(); contenders],
        }
    }

    /// The order in which round `round` runs the contenders: rotated from round to round, and
    /// reversed every other round, so none always runs first, nor right after the same other one
    /// (whose leftovers, caches or freed memory, it would inherit): a rotation alone keeps every
    /// neighbour.
    pub fn order(&self, round: usize) -> impl Iterator<Item = usize> + use<> {
        let n = self.times.len();
        let reversed = round % 2 == 1;
        (0..n).map(move |i| {
            let at = (i + round) % n;
            if reversed { n - 1 - at } else { at }
        })
    }

    pub fn push(&mut self, contender: usize, time: Duration) {
        self.times[contender].push(time);
    }

    /// The contender's fastest round.
    pub fn best(&self, contender: usize) -> Duration {
        *self.times[contender]
            .iter()
            .min()
            .expect("at least one round")
    }

    /// The contender's median round.
    pub fn median(&self, contender: usize) -> Duration {
        let mut t = self.times[contender].clone();
        assert!(!t.is_empty(), "at least one round");
        t.sort();
        t[t.len() / 2]
    }

    /// The median over rounds of `base`'s time divided by `contender`'s: how fast the
    /// contender runs next to the base (above 1: faster).
    pub fn median_ratio(&self, contender: usize, base: usize) -> f64 {
        let mut r: Vec<f64> = self.times[base]
            .iter()
            .zip(&self.times[contender])
            .map(|(b, c)| b.as_secs_f64() / c.as_secs_f64())
            .collect();
        assert!(!r.is_empty(), "at least one round");
        r.sort_by(f64::total_cmp);
        let mid = r.len() / 2;
        if r.len() % 2 == 1 {
            r[mid]
        } else {
            (r[mid - 1] + r[mid]) / 2.0
        }
    }
}

/// How a ratio reads in words, so that every line says which side is ahead without the reader
/// working out which way the ratio was taken.
#[derive(Debug, Clone, Copy)]
#[allow(dead_code)] // each bench uses some of them
pub enum Sense {
    /// A speed of the line's subject over its baseline's: above 1, the subject is faster.
    Faster,
    /// A speed of kpack-fuse over the line's subject (another file system): above 1,
    /// kpack-fuse is faster.
    KpackFaster,
    /// A time of the line's subject over its baseline's: below 1, the subject is faster.
    Time,
    /// A size (bytes on disk, memory) of the subject over its baseline's: below 1, smaller.
    Size,
}

/// The ratio in words: within 2% of 1 counts as even.
pub fn plainly(ratio: f64, sense: Sense) -> &'static str {
    let (above, below, even) = match sense {
        Sense::Faster => ("faster", "slower", "as fast"),
        Sense::KpackFaster => (
            "kpack-fuse faster",
            "kpack-fuse slower",
            "as fast as kpack-fuse",
        ),
        Sense::Time => ("slower", "faster", "as fast"),
        Sense::Size => ("larger", "smaller", "the same size"),
    };
    if ratio > 1.02 {
        above
    } else if ratio < 0.98 {
        below
    } else {
        even
    }
}
