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
//! The archive is read through a [`FaultySource`] (`tests/it/support/faulty_source.rs`), which
//! sees every read of a kernel's frame (a decode) and can fail, cut short, delay or corrupt the
//! reads of chosen kernels. Checked after every step:
//! * every read returns the archive's exact bytes, short only at the end of the file; a kernel
//!   whose reads are faulted may instead fail with EIO, never with other bytes;
//! * an inode never has passthrough and daemon-read handles open at once, all its passthrough
//!   handles share one backing id, and no file is opened without the daemon while its inode
//!   has a passthrough handle (Linux fails each of these opens with EIO);
//! * a kernel is decoded at most once while it is held, by a handle or by the mount;
//! * the bytes the mount keeps stay within its cache's bound.
//!
//! And once the faults are switched off, every kernel reads back exactly: nothing a failure
//! left behind is served or waited on.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::errno::Errno;
use super::policy::{Granted, Handle, OpenMode, OpenPolicy};
use super::read::fill::OpenedFile;
use super::steps::{self, Decoders};
use super::store::KernelId;
use super::store::{BackingFile, Placement};
use super::tests::{Blocking, ReadSlice};
use super::tree::{Entry, Ino};
use super::{FsOptions, KpackFs, kernel_id};
use crate::archive::Archive;
use crate::archive::byte_source::LocalFile;
use crate::archive::writer::{ArchiveWriter, Compression};
use crate::sync::lock;

use crate as kpack;
#[path = "../../tests/it/support/faulty_source.rs"]
mod faulty_source;
use faulty_source::{Fault, FaultKind, FaultySource};

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

/// A mount to try: kernel sizes, where backing files live, the open mode asked for and what
/// the kernel grants, its cache bound as a share of all the kernels' bytes, and faults on the
/// reads of some kernels (kernel index modulo the number of kernels).
#[derive(Debug, Clone)]
struct Setup {
    sizes: Vec<usize>,
    memory: bool,
    mode: OpenMode,
    granted: Granted,
    cache_percent: u64,
    faults: Vec<(usize, FaultKind)>,
}

fn fault_kind() -> impl Strategy<Value = FaultKind> {
    prop_oneof![
        Just(FaultKind::Fail),
        Just(FaultKind::Truncate),
        Just(FaultKind::Flip),
        (0..3u64).prop_map(|ms| FaultKind::Delay(Duration::from_millis(ms))),
    ]
}

fn setup() -> impl Strategy<Value = Setup> {
    let size = prop_oneof![Just(0usize), 1..5_000usize, 60_000..300_000usize];
    let mode = prop_oneof![Just(OpenMode::PageCache), Just(OpenMode::Daemon)];
    // Most kernels open without the daemon when asked to (Linux 4.19+).
    let no_open = prop::bool::weighted(0.8);
    let faults = prop_oneof![
        3 => Just(Vec::new()),
        1 => prop::collection::vec((any::<usize>(), fault_kind()), 1..3),
    ];
    (
        prop::collection::vec(size, 1..7),
        any::<bool>(),
        mode,
        (no_open, any::<bool>()),
        20..150u64,
        faults,
    )
        .prop_map(
            |(sizes, memory, mode, (no_open, passthrough), cache_percent, faults)| Setup {
                sizes,
                memory,
                mode,
                granted: Granted {
                    no_open,
                    passthrough,
                },
                cache_percent,
                faults,
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
    /// Per file: inode, kernel id, bytes, and whether reads of its kernel are faulted.
    files: Vec<(Ino, KernelId, Vec<u8>, bool)>,
    capacity: u64,
    /// Every read of a kernel's frame (a decode), with whether the kernel was held then.
    decode_log: Arc<Mutex<Vec<(KernelId, bool)>>>,
    /// The archive's source, whose faults [`Mount::heal`] switches off.
    source: FaultySource,
}

/// Each kernel's frame: its byte range in the archive.
type Frames = Vec<(std::ops::Range<u64>, KernelId)>;

impl Mount {
    fn new(s: &Setup) -> Mount {
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
        // Filled once the archive is open and the file system made: the frames to watch, and
        // the file system to ask whether a kernel is held when its frame is read.
        let frames: Arc<OnceLock<Frames>> = Arc::default();
        let mounted: Arc<OnceLock<Weak<KpackFs>>> = Arc::default();
        let decode_log: Arc<Mutex<Vec<(KernelId, bool)>>> = Arc::default();
        let (watched, held_by, log) = (frames.clone(), mounted.clone(), decode_log.clone());
        let observe = move |offset: u64, len: usize| {
            let (Some(frames), Some(fs)) = (watched.get(), held_by.get().and_then(Weak::upgrade))
            else {
                return;
            };
            let end = offset + len as u64;
            for (range, id) in frames {
                if range.start < end && offset < range.end {
                    let held = fs.store().contains(*id);
                    lock(&log).push((*id, held));
                }
            }
        };
        let source = FaultySource::new(LocalFile::open(&path).unwrap()).observed(Arc::new(observe));
        let archive = Arc::new(Archive::open_source(Box::new(source.clone())).unwrap());
        let (mut fs, _) = KpackFs::new(vec![archive.clone()], &opts).unwrap();
        let mut spans = Vec::new();
        let files = (1..=fs.tree.len())
            .filter_map(|ino| match fs.tree.entry(ino) {
                Some(Entry::File(f)) => {
                    let k: usize = fs.names_of(f).0[1..].parse().unwrap();
                    let faulted: Vec<FaultKind> = s
                        .faults
                        .iter()
                        .filter(|(i, _)| i % s.sizes.len() == k)
                        .map(|(_, kind)| *kind)
                        .collect();
                    let kref = archive
                        .locate_at(f.binary as usize, f.entry as usize)
                        .unwrap();
                    let frame = kref.stored.offset..kref.stored.offset + kref.stored.size;
                    spans.push((frame.clone(), kernel_id(f)));
                    for kind in &faulted {
                        source.add(Fault {
                            range: frame.clone(),
                            kind: *kind,
                        });
                    }
                    Some((ino, kernel_id(f), kernels[k].clone(), !faulted.is_empty()))
                }
                _ => None,
            })
            .collect();
        frames.set(spans).unwrap();
        fs.plan_open_mode(s.mode, true);
        steps::granted(&fs, s.granted);
        let fs = Arc::new(fs);
        mounted.set(Arc::downgrade(&fs)).unwrap();
        Mount {
            _dir: dir,
            decoders: Decoders::new(fs.clone(), DECODE_THREADS),
            fs,
            policy: Mutex::new(OpenPolicy::default()),
            kernel: Mutex::new(FakeKernel::default()),
            files,
            capacity,
            decode_log,
            source,
        }
    }

    /// Switches the faults off, releases `open` handles and reads every file whole: each must
    /// read back exactly, whatever failed before.
    fn heal(&self, open: Vec<(u64, usize)>) -> Result<(), String> {
        self.decoders.wait_idle();
        for (fh, _) in open {
            self.release(fh);
        }
        self.source.clear();
        for f in 0..self.files.len() {
            match self.open(f)? {
                Some(fh) => {
                    self.read(f, Some(fh), 0, u32::MAX)?;
                    self.release(fh);
                }
                None => self.read(f, None, 0, u32::MAX)?,
            }
        }
        Ok(())
    }

    /// Opens file `f` as the adapter does; returns its handle, or `None` when the kernel
    /// opened it alone (page-cache mode).
    fn open(&self, f: usize) -> Result<Option<u64>, String> {
        let (ino, _, _, faulted) = self.files[f];
        let (tx, rx) = mpsc::channel();
        let done = Box::new(move |r| drop(tx.send(r)));
        steps::open(&self.decoders, ino, libc::O_RDONLY, done);
        match self.answer(ino, rx) {
            Err(e) if faulted && e.ends_with(&format!("{:?}", Errno::EIO)) => Ok(None),
            answer => answer,
        }
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
            Err(Errno::ENOSYS) if self.page_cache() => {
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
    fn read_ino(&self, ino: Ino, at: u64, len: u32) -> Result<ReadSlice, Errno> {
        let (tx, rx) = mpsc::channel();
        let done = Box::new(move |r: Result<&[u8], Errno>| drop(tx.send(r.map(<[u8]>::to_vec))));
        steps::read_ino(&self.decoders, ino, at, len, done);
        rx.recv().map_err(|_| Errno::EIO)?.map(ReadSlice)
    }

    fn page_cache(&self) -> bool {
        self.fs.mode().page_cache()
    }

    /// Reads through `fh`, or by inode without one, and compares with the model.
    fn read(&self, f: usize, fh: Option<u64>, at: u64, len: u32) -> Result<(), String> {
        let (ino, _, ref bytes, faulted) = self.files[f];
        let at = at % (bytes.len() as u64 + 3);
        let got = match fh {
            Some(fh) => self.fs.read(fh, at, len),
            None => self.read_ino(ino, at, len),
        };
        let got = match got {
            Err(Errno::EIO) if faulted && !self.source_healed() => return Ok(()),
            got => got.map_err(|e| format!("read of inode {ino} at {at}: {e:?}"))?,
        };
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

    /// Whether the faults are off (see [`Mount::heal`]).
    fn source_healed(&self) -> bool {
        self.source.is_clear()
    }

    /// Frame reads so far (see [`Mount::decoded_while_held`]).
    fn decodes(&self) -> usize {
        lock(&self.decode_log).len()
    }

    /// A frame read since the `from`th while its kernel was held (by the store, or by anyone
    /// through a file the store made, such as an open handle): a decode of a held kernel.
    fn decoded_while_held(&self, from: usize) -> Option<KernelId> {
        let log = lock(&self.decode_log);
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
        self.heal(open)
    }
}

impl Drop for Mount {
    /// The decodes ahead still running end before the archive and backing files go.
    fn drop(&mut self) {
        self.decoders.wait_idle();
    }
}

/// Runs the model over random setups and sequences; returns the first failure, shrunk.
fn check(cases: u32) -> Result<(), String> {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (setup(), prop::collection::vec(op(), 1..40));
    runner
        .run(&strategy, |(s, ops)| {
            Mount::new(&s).run(&ops).map_err(TestCaseError::fail)
        })
        .map_err(|e| e.to_string())
}

#[test]
fn the_read_path_matches_the_model() {
    check(96).unwrap();
}

/// The model catches wrong bytes: here the model's own copy of one kernel differs from the
/// archive, as if the mount served another kernel's bytes.
#[test]
fn the_model_catches_wrong_bytes() {
    let s = Setup {
        sizes: vec![4000, 4000],
        memory: true,
        mode: OpenMode::Daemon,
        granted: Granted {
            no_open: true,
            passthrough: false,
        },
        cache_percent: 100,
        faults: Vec::new(),
    };
    let mut mount = Mount::new(&s);
    let ino = mount.files[1].0;
    mount.files[1].2[0] ^= 1;
    let e = mount
        .run(&[
            Op::Open(1),
            Op::Read {
                handle: 0,
                at: 0,
                len: 10,
            },
        ])
        .unwrap_err();
    assert!(e.contains(&format!("read of inode {ino} at 0")), "{e}");
}

/// Faults at the archive's source on every kernel, one kind at a time: reads get exact bytes
/// or EIO, nothing hangs, and once the faults are off every kernel reads back exactly.
#[test]
fn faults_at_the_source_give_eio_and_leave_nothing_behind() {
    for kind in [
        FaultKind::Fail,
        FaultKind::Truncate,
        FaultKind::Flip,
        FaultKind::Delay(Duration::from_millis(2)),
    ] {
        for mode in [OpenMode::Daemon, OpenMode::PageCache] {
            let s = Setup {
                sizes: vec![0, 3000, 70_000, 200_000],
                memory: false,
                mode,
                granted: Granted {
                    no_open: true,
                    passthrough: true,
                },
                cache_percent: 150,
                faults: (0..4).map(|k| (k, kind)).collect(),
            };
            let mount = Mount::new(&s);
            mount
                .run(&[
                    Op::Scan,
                    Op::Open(3),
                    Op::Read {
                        handle: 0,
                        at: 1,
                        len: 99_999,
                    },
                ])
                .unwrap_or_else(|e| panic!("{kind:?}, {mode:?}: {e}"));
        }
    }
}

/// Two passes over a tree, opening through the daemon and in page-cache mode: the decode
/// threads decode files ahead of the first pass, each kernel is decoded once, and every byte
/// read is the archive's.
#[test]
fn scans_decode_ahead_on_several_threads_and_each_kernel_once() {
    for mode in [OpenMode::Daemon, OpenMode::PageCache] {
        let s = Setup {
            sizes: (0..12).map(|k| 150_000 + 1000 * k).collect(),
            memory: false,
            mode,
            granted: Granted {
                no_open: true,
                passthrough: true,
            },
            cache_percent: 200,
            faults: Vec::new(),
        };
        let mount = Mount::new(&s);
        mount.run(&[Op::Scan, Op::Scan]).unwrap();
        mount.decoders.wait_idle();
        let ahead = mount.fs.decodes.started_ahead();
        assert!(ahead >= 2, "{mode:?}: {ahead} decoded ahead");
        assert_eq!(mount.fs.cache_stats().decodes, 12, "{mode:?}");
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
            let mount = Mount::new(&s);
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
