//! A reference-model test of the read path. Random sequences of opens, reads at random offsets
//! (through a handle, or by inode in page-cache mode), releases, scans that decode ahead, backing
//! ids the kernel refuses and evictions (caches smaller than the kernels) run against `KpackFs`
//! and the open policy, through the steps the FUSE adapter runs (`steps.rs`), from one thread and
//! from several, with [`DECODE_THREADS`] decode threads that decode ahead of scans as they do in
//! the mount, on mounts that open through the daemon and mounts in page-cache mode (as `init`
//! decides them, a kernel that cannot open without the daemon included). The model is the
//! archive's bytes, and a fake kernel that keeps Linux's rules for FUSE handles: it sends READs
//! by inode only in page-cache mode, and OPENs only outside it.
//!
//! Checked after every step:
//! * every read returns the archive's exact bytes, short only at the end of the file;
//! * an inode never has passthrough and daemon-read handles open at once, all its passthrough
//!   handles share one backing id, and no file is opened without the daemon while its inode
//!   has a passthrough handle (Linux fails each of these opens with EIO);
//! * a kernel is decoded at most once while it is held, by a handle or by the mount;
//! * the bytes the mount keeps stay within its cache's bound.
//!
//! The fault it catches, switched on by a test below that expects the model to fail:
//! `Fault::IgnoreStore` (a request that does not find a kept kernel and decodes it again).

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::policy::{Granted, Handle, OpenPolicy, Start};
use super::read::fill::OpenedFile;
use super::steps::{self, Decoders};
use super::store::KernelId;
use super::store::{BackingFile, Placement};
use super::tree::{Entry, Ino};
use super::{Errno, Fault, FsOptions, KpackFs, kernel_id};
use crate::archive::Archive;
use crate::archive::writer::{ArchiveWriter, Compression};
use crate::sync::lock;

/// One step of a sequence.
#[derive(Debug, Clone)]
enum Op {
    /// Open file `.0` (modulo the number of files).
    Open(usize),
    /// Read `len` bytes at `at` (modulo the file's size plus a little) through open handle
    /// `handle` (modulo the handles open), or by inode in page-cache mode.
    Read {
        handle: usize,
        at: u64,
        len: u32,
    },
    Release(usize),
    /// Open and release every file in inode order: a scan, which decodes ahead.
    Scan,
    /// The kernel refuses the next backing id.
    RefuseNextId,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<usize>().prop_map(Op::Open),
        5 => (any::<usize>(), any::<u64>(), 1..200_000u32)
            .prop_map(|(handle, at, len)| Op::Read { handle, at, len }),
        3 => any::<usize>().prop_map(Op::Release),
        1 => Just(Op::Scan),
        1 => Just(Op::RefuseNextId),
    ]
}

/// A mount to try: kernel sizes, where backing files live, how the mount starts, and its cache
/// bound as a share of all the kernels' bytes.
#[derive(Debug, Clone)]
struct Setup {
    sizes: Vec<usize>,
    memory: bool,
    start: Start,
    passthrough: Granted,
    cache_percent: u64,
}

fn setup() -> impl Strategy<Value = Setup> {
    let size = prop_oneof![Just(0usize), 1..5_000usize, 60_000..300_000usize];
    let start = prop_oneof![Just(Start::PageCache), Just(Start::Opens)];
    // Most kernels open without the daemon when asked to (Linux 4.19+).
    let no_open = prop::bool::weighted(0.8);
    (
        prop::collection::vec(size, 1..7),
        any::<bool>(),
        start,
        (no_open, any::<bool>()),
        20..150u64,
    )
        .prop_map(
            |(sizes, memory, start, (no_open, passthrough), cache_percent)| Setup {
                sizes,
                memory,
                start,
                passthrough: Granted {
                    no_open,
                    passthrough,
                },
                cache_percent,
            },
        )
}

/// Kernel `k`'s bytes: compressible, and different from every other kernel's.
fn kernel_bytes(k: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i / 7 + k * 13) % 251) as u8 ^ (i % 3) as u8)
        .collect()
}

/// The fake kernel: the FUSE handles it has open, and the rules Linux keeps for them.
#[derive(Default)]
struct FakeKernel {
    /// Handle to (inode, backing id when passed through).
    handles: HashMap<u64, (Ino, Option<u64>)>,
    refuse_next: bool,
    next_id: u64,
}

impl FakeKernel {
    fn register(&mut self) -> Result<u64, String> {
        if std::mem::take(&mut self.refuse_next) {
            return Err("Operation not permitted".into());
        }
        self.next_id += 1;
        Ok(self.next_id)
    }

    fn of(&self, ino: Ino) -> impl Iterator<Item = Option<u64>> + '_ {
        self.handles
            .values()
            .filter(move |(i, _)| *i == ino)
            .map(|(_, id)| *id)
    }

    /// The reply to an OPEN, as Linux would take it.
    fn opened(&mut self, ino: Ino, fh: u64, handle: &Handle<u64>) -> Result<(), String> {
        let id = match handle {
            Handle::Passthrough(id) => Some(*id),
            Handle::Daemon => None,
            Handle::Register => return Err("an open answered with Register".into()),
        };
        for other in self.of(ino) {
            match (id, other) {
                (Some(_), None) => {
                    return Err(format!("inode {ino}: passthrough beside a daemon handle"));
                }
                (None, Some(_)) => {
                    return Err(format!("inode {ino}: daemon handle beside passthrough"));
                }
                (Some(a), Some(b)) if a != b => {
                    return Err(format!("inode {ino}: two backing ids, {a} and {b}"));
                }
                _ => {}
            }
        }
        self.handles.insert(fh, (ino, id));
        Ok(())
    }

    /// An open the kernel makes without the daemon (after ENOSYS).
    fn opened_alone(&self, ino: Ino) -> Result<(), String> {
        if self.of(ino).any(|id| id.is_some()) {
            return Err(format!("inode {ino}: opened alone beside passthrough"));
        }
        Ok(())
    }
}

/// A mount under test: the filesystem with its decode threads, its open policy and fake kernel,
/// and the model.
/// Decode threads of a model mount: more than one, so that several files decode ahead at once.
const DECODE_THREADS: usize = 3;

struct Mount {
    _dir: tempfile::TempDir,
    fs: Arc<KpackFs>,
    decoders: Decoders,
    policy: Mutex<OpenPolicy<u64>>,
    kernel: Mutex<FakeKernel>,
    /// Per file: inode, kernel id, bytes.
    files: Vec<(Ino, KernelId, Vec<u8>)>,
    capacity: u64,
}

impl Mount {
    fn new(s: &Setup, fault: Fault) -> Mount {
        let dir = tempfile::tempdir().unwrap();
        let kernels: Vec<Vec<u8>> = s
            .sizes
            .iter()
            .enumerate()
            .map(|(k, &len)| kernel_bytes(k, len))
            .collect();
        let mut w = ArchiveWriter::new(
            "g",
            "fam",
            vec!["gfx900".to_owned()],
            Compression::Zstd { level: 1 },
        )
        .unwrap();
        for (k, bytes) in kernels.iter().enumerate() {
            w.add_kernel(&format!("k{k}"), "gfx900", bytes.clone())
                .unwrap();
        }
        let path = dir.path().join("m.kpack");
        w.write(&path, &|_| {}).unwrap();
        let total: u64 = kernels.iter().map(|k| k.len() as u64).sum();
        let capacity = total * s.cache_percent / 100;
        let opts = FsOptions {
            cache_size: capacity,
            backing: if s.memory {
                Placement::Memory
            } else {
                Placement::Scratch(dir.path().to_path_buf())
            },
            files_max: 64,
            gpus: Vec::new(),
            uid: 0,
            gid: 0,
        };
        let archive = Arc::new(Archive::open(&path).unwrap());
        let (fs, _) = KpackFs::new(vec![archive], &opts).unwrap();
        *lock(&fs.fault) = fault;
        let files = (1..=fs.tree().len())
            .filter_map(|ino| match fs.tree().entry(ino) {
                Some(Entry::File(f)) => {
                    let k: usize = fs.names_of(f).0[1..].parse().unwrap();
                    Some((ino, kernel_id(f), kernels[k].clone()))
                }
                _ => None,
            })
            .collect();
        let policy = Mutex::new(OpenPolicy::new(s.start, true));
        steps::granted(&fs, &policy, s.passthrough);
        let fs = Arc::new(fs);
        Mount {
            _dir: dir,
            decoders: Decoders::new(fs.clone(), DECODE_THREADS),
            fs,
            policy,
            kernel: Mutex::new(FakeKernel::default()),
            files,
            capacity,
        }
    }

    /// Opens file `f` as the adapter does; returns its handle, or `None` when the kernel
    /// opened it alone (page-cache mode).
    fn open(&self, f: usize) -> Result<Option<u64>, String> {
        let (ino, _, _) = self.files[f];
        let (tx, rx) = mpsc::channel();
        let done = Box::new(move |r| drop(tx.send(r)));
        steps::open(&self.decoders, &self.policy, ino, libc::O_RDONLY, done);
        self.answer(ino, rx)
    }

    /// The rest of an open once its answer comes: a handle, or the kernel opening alone.
    fn answer(
        &self,
        ino: Ino,
        rx: mpsc::Receiver<Result<OpenedFile, Errno>>,
    ) -> Result<Option<u64>, String> {
        let opened = rx.recv().map_err(|_| "an open was never answered")?;
        let opened = match opened {
            Ok(opened) => opened,
            // Page-cache mode: the kernel opens the file by itself.
            Err(Errno::ENOSYS) if lock(&self.policy).page_cache() => {
                lock(&self.kernel).opened_alone(ino)?;
                return Ok(None);
            }
            Err(e) => return Err(format!("open of inode {ino}: {e:?}")),
        };
        let register = |_: &BackingFile| lock(&self.kernel).register();
        let (new, handle) = steps::answer(&self.fs, &self.policy, ino, opened, register);
        lock(&self.kernel).opened(ino, new.fh, &handle)?;
        Ok(Some(new.fh))
    }

    fn release(&self, fh: u64) {
        // Linux lets go of the file (and its backing file) before it sends the RELEASE, so an
        // open the daemon answers after the RELEASE never meets the handle in the kernel.
        lock(&self.kernel).handles.remove(&fh);
        steps::release(&self.fs, &self.policy, fh);
    }

    /// A READ by inode, as the adapter runs it (it may start decodes ahead of a scan).
    fn read_ino(&self, ino: Ino, at: u64, len: u32) -> Result<super::ReadSlice, Errno> {
        let (tx, rx) = mpsc::channel();
        let done = Box::new(move |r: Result<&[u8], Errno>| drop(tx.send(r.map(<[u8]>::to_vec))));
        steps::read_ino(&self.decoders, ino, at, len, done);
        rx.recv().map_err(|_| Errno::EIO)?.map(super::ReadSlice)
    }

    fn page_cache(&self) -> bool {
        lock(&self.policy).page_cache()
    }

    /// Reads through `fh`, or by inode without one, and compares with the model.
    fn read(&self, f: usize, fh: Option<u64>, at: u64, len: u32) -> Result<(), String> {
        let (ino, _, ref bytes) = self.files[f];
        let at = at % (bytes.len() as u64 + 3);
        let got = match fh {
            Some(fh) => self.fs.read(fh, at, len),
            None => self.read_ino(ino, at, len),
        }
        .map_err(|e| format!("read of inode {ino} at {at}: {e:?}"))?;
        let start = (at as usize).min(bytes.len());
        let end = start.saturating_add(len as usize).min(bytes.len());
        if got.as_slice() != &bytes[start..end] {
            return Err(format!(
                "read of inode {ino} at {at}, {len} bytes: {} bytes that differ from the archive's",
                got.as_slice().len()
            ));
        }
        Ok(())
    }

    fn decodes(&self) -> usize {
        lock(&self.fs.decode_log).len()
    }

    /// A decode since the `from`th that started while its kernel was held (by the store, or
    /// by anyone through a file the store made, such as an open handle).
    fn decoded_while_held(&self, from: usize) -> Option<KernelId> {
        let log = lock(&self.fs.decode_log);
        log[from..]
            .iter()
            .find(|(_, held)| *held)
            .map(|(id, _)| *id)
    }

    /// Runs `ops` from one thread, checking the model after every step.
    fn run(&self, ops: &[Op]) -> Result<(), String> {
        // Open handles: (handle, file).
        let mut open: Vec<(u64, usize)> = Vec::new();
        // Files the kernel opened alone, read by inode.
        let mut alone: Vec<usize> = Vec::new();
        let n = self.files.len();
        for (step, op) in ops.iter().enumerate() {
            let decoded = self.decodes();
            let outcome = match op {
                Op::Open(f) => self.open(f % n).map(|fh| match fh {
                    Some(fh) => open.push((fh, f % n)),
                    None => alone.push(f % n),
                }),
                Op::Read { handle, at, len } => {
                    let both = open.len() + alone.len();
                    if both == 0 {
                        Ok(())
                    } else if handle % both < open.len() {
                        let (fh, f) = open[handle % both];
                        self.read(f, Some(fh), *at, *len)
                    } else {
                        self.read(alone[handle % both - open.len()], None, *at, *len)
                    }
                }
                Op::Release(h) => {
                    if !open.is_empty() {
                        let (fh, _) = open.remove(h % open.len());
                        self.release(fh);
                    }
                    Ok(())
                }
                Op::Scan => (0..n).try_for_each(|f| match self.open(f)? {
                    Some(fh) => {
                        self.read(f, Some(fh), 0, u32::MAX)?;
                        self.release(fh);
                        Ok(())
                    }
                    None => self.read(f, None, 0, u32::MAX),
                }),
                Op::RefuseNextId => {
                    lock(&self.kernel).refuse_next = true;
                    Ok(())
                }
            };
            outcome.map_err(|e| format!("step {step} ({op:?}): {e}"))?;
            if let Some(again) = self.decoded_while_held(decoded) {
                return Err(format!(
                    "step {step} ({op:?}): decoded {again:?} while held"
                ));
            }
            let kept = self.fs.cache_stats().bytes_cached;
            if kept > self.capacity {
                return Err(format!(
                    "step {step}: {kept} bytes kept, bound {}",
                    self.capacity
                ));
            }
        }
        for (fh, _) in open {
            self.release(fh);
        }
        Ok(())
    }
}

impl Drop for Mount {
    /// The decodes ahead still running end before the archive and backing files go.
    fn drop(&mut self) {
        self.decoders.wait_idle();
    }
}

/// Runs the model over random setups and sequences; returns the first failure, shrunk.
fn check(cases: u32, fault: Fault) -> Result<(), String> {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (setup(), prop::collection::vec(op(), 1..40));
    runner
        .run(&strategy, |(s, ops)| {
            Mount::new(&s, fault).run(&ops).map_err(TestCaseError::fail)
        })
        .map_err(|e| e.to_string())
}

#[test]
fn the_read_path_matches_the_model() {
    check(96, Fault::None).unwrap();
}

// The test of the fault stops at its first failing case: 2048 cases cost time only when the
// fault goes unseen.
#[test]
fn the_model_catches_a_kept_kernel_decoded_again() {
    let e = check(2048, Fault::IgnoreStore).unwrap_err();
    assert!(e.contains("while held"), "{e}");
}

/// Two passes over a tree, opening through the daemon and in page-cache mode: the decode
/// threads decode files ahead of the first pass, each kernel is decoded once, and every byte
/// read is the archive's.
#[test]
fn scans_decode_ahead_on_several_threads_and_each_kernel_once() {
    for start in [Start::Opens, Start::PageCache] {
        let s = Setup {
            sizes: (0..12).map(|k| 150_000 + 1000 * k).collect(),
            memory: false,
            start,
            passthrough: Granted {
                no_open: true,
                passthrough: true,
            },
            cache_percent: 200,
        };
        let mount = Mount::new(&s, Fault::None);
        mount.run(&[Op::Scan, Op::Scan]).unwrap();
        mount.decoders.wait_idle();
        let ahead = mount
            .fs
            .scans
            .started
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(ahead >= 2, "{start:?}: {ahead} decoded ahead");
        assert_eq!(mount.decodes(), 12, "{start:?}");
    }
}

/// Several threads share one mount, each running its own sequence; reads are checked as they
/// come and the kernel's rules on every reply.
#[test]
fn the_read_path_matches_the_model_from_several_threads() {
    let mut runner = TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        setup(),
        prop::collection::vec(prop::collection::vec(op(), 1..30), 3),
    );
    runner
        .run(&strategy, |(s, sequences)| {
            let mount = Mount::new(&s, Fault::None);
            std::thread::scope(|scope| {
                let threads: Vec<_> = sequences
                    .iter()
                    .map(|ops| scope.spawn(|| mount.run_concurrently(ops)))
                    .collect();
                for t in threads {
                    t.join()
                        .map_err(|_| TestCaseError::fail("a thread panicked"))?
                        .map_err(TestCaseError::fail)?;
                }
                Ok(())
            })
        })
        .unwrap();
}

impl Mount {
    /// Like [`Mount::run`], but with other threads at work on the same mount; the byte bound,
    /// which other threads' steps move, is not checked.
    fn run_concurrently(&self, ops: &[Op]) -> Result<(), String> {
        let decoded = self.decodes();
        let mut open: Vec<(u64, usize)> = Vec::new();
        let n = self.files.len();
        for op in ops {
            match op {
                Op::Open(f) => {
                    if let Some(fh) = self.open(f % n)? {
                        open.push((fh, f % n));
                    }
                }
                Op::Read { handle, at, len } if !open.is_empty() => {
                    let (fh, f) = open[handle % open.len()];
                    self.read(f, Some(fh), *at, *len)?;
                }
                // Linux reads by inode only in page-cache mode.
                Op::Read { handle, at, len } if self.page_cache() => {
                    self.read(handle % n, None, *at, *len)?
                }
                Op::Read { .. } => {}
                Op::Release(h) if !open.is_empty() => {
                    let (fh, _) = open.remove(h % open.len());
                    self.release(fh);
                }
                Op::Release(_) => {}
                Op::Scan => {
                    for f in 0..n {
                        match self.open(f)? {
                            Some(fh) => {
                                self.read(f, Some(fh), 0, u32::MAX)?;
                                self.release(fh);
                            }
                            None => self.read(f, None, 0, u32::MAX)?,
                        }
                    }
                }
                Op::RefuseNextId => lock(&self.kernel).refuse_next = true,
            }
        }
        if let Some(again) = self.decoded_while_held(decoded) {
            return Err(format!("decoded {again:?} while held"));
        }
        for (fh, _) in open {
            self.release(fh);
        }
        Ok(())
    }
}
