//! The inode tree of a mount, built once before mounting and never changed afterwards.
//!
//! Each TOC key is split on `/` into directories; its last component is a directory holding one
//! `<arch>.hsaco` file per arch entry. Inode numbers are indices: the root is 1, then every
//! directory and file in the order they were added (archives in the order given, keys in TOC
//! order), so they are stable for the life of the mount. Symbolic links (fallback names and
//! `native.hsaco`) never get entries of their own: the link to file `f` is inode `f + n`, where
//! `n` is the number of real nodes, so any number of names resolving to the same sibling share
//! one link inode and lookups allocate nothing.
//!
//! A mount may show a million entries, so the tree costs a small fixed number of bytes per node:
//! every name lives once in one arena (a file name such as `gfx942.hsaco` once per arch, however
//! many directories hold it), a node is three `u32`s, and a directory's children are one range of
//! a shared index array, sorted by name: `lookup` is a binary search in that range and `readdir`
//! walks it. While building, a hash index over (parent, name) finds existing nodes in O(1); it is
//! dropped when the tree is finished.
//!
//! The builder takes archives one at a time so that a mount can merge several of them; the
//! first archive to provide a (key, arch) wins and later ones are reported as duplicates.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

use crate::archive::Archive;
use crate::error::Error;
use crate::host::target_id;
use crate::names;

pub type Ino = u64;

/// The root directory's inode number (fixed by FUSE).
pub const ROOT: Ino = 1;

/// The name of the link to the kernel the local GPU would load.
pub const NATIVE: &str = "native.hsaco";

/// Longest file name Linux accepts.
pub const NAME_MAX: usize = names::NAME_MAX;

/// Most real nodes a tree holds: indices are `u32`s and link inodes (`file + n`) must not wrap.
const MAX_NODES: usize = (u32::MAX / 2) as usize;

/// One kernel file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileNode {
    /// Index of the archive in the mount's archive list.
    pub archive: u32,
    /// Index into that archive's `binaries()`.
    pub binary: u32,
    /// Index into that binary's `arches`.
    pub entry: u32,
    pub ordinal: u32,
    /// What reading the file returns: the blob size (`none`) or `original_size` (zstd).
    pub size: u64,
    /// Bytes stored in the archive (0 when the TOC points at nothing).
    pub stored_size: u64,
}

/// One directory: where its children are in the tree's index array, and what it links to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirNode {
    /// First of this directory's children in `Tree::children`.
    first: u32,
    /// Number of children.
    count: u32,
    /// Number of child directories (for `nlink`), with [`HAS_FILES`] set when any child is a
    /// kernel file (only those directories answer fallback names).
    subdirs: u32,
    /// Inode of the file `native.hsaco` links to, 0 when no GPU resolves here.
    native: u32,
}

/// Marks a directory that holds kernel files, in [`DirNode::subdirs`]. A directory's subdirectory
/// count stays below it (nodes are at most [`MAX_NODES`]).
const HAS_FILES: u32 = 1 << 31;

impl DirNode {
    /// Number of child directories (for `nlink`).
    pub fn subdirs(&self) -> u32 {
        self.subdirs & !HAS_FILES
    }

    /// The file `native.hsaco` links to, when a GPU resolves here.
    pub fn native(&self) -> Option<Ino> {
        (self.native != 0).then_some(Ino::from(self.native))
    }

    /// Whether any child is a kernel file.
    pub fn has_files(&self) -> bool {
        self.subdirs & HAS_FILES != 0
    }
}

/// What an inode number stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry<'a> {
    Dir(&'a DirNode),
    File(&'a FileNode),
    /// A symbolic link to the file with this inode, in the same directory.
    Link(Ino),
}

/// A key or arch name that cannot be shown as a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeError {
    pub archive: String,
    pub key: String,
    pub reason: String,
}

impl fmt::Display for TreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: key {:?} cannot be mounted: {}",
            self.archive, self.key, self.reason
        )
    }
}

impl std::error::Error for TreeError {}

/// A (key, arch) that an earlier archive already provided; the earlier one is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duplicate {
    pub key: String,
    pub arch: String,
    /// Index of the archive whose entry is shown.
    pub kept: u32,
    /// Index of the archive whose entry was dropped.
    pub dropped: u32,
}

/// Marks a node's `slot` as an index into `files` rather than `dirs`.
const FILE: u32 = 1 << 31;

/// One node: 12 bytes whatever its name.
#[derive(Debug, Clone, Copy)]
struct Rec {
    /// Index of the parent node (the root is its own parent).
    parent: u32,
    /// Offset of the name in the arena.
    name: u32,
    /// Index into `dirs`, or into `files` with [`FILE`] set.
    slot: u32,
}

impl Rec {
    fn file(self) -> Option<usize> {
        (self.slot & FILE != 0).then_some((self.slot & !FILE) as usize)
    }

    fn dir(self) -> Option<usize> {
        (self.slot & FILE == 0).then_some(self.slot as usize)
    }
}

/// Every name once: a length byte (names are at most [`NAME_MAX`] bytes), then the bytes.
#[derive(Debug, Default)]
struct Arena(Vec<u8>);

impl Arena {
    fn get(&self, at: u32) -> &[u8] {
        let at = at as usize;
        let len = usize::from(self.0[at]);
        &self.0[at + 1..at + 1 + len]
    }

    fn push(&mut self, name: &str) -> Result<u32, String> {
        let len = u8::try_from(name.len())
            .map_err(|_| format!("name of {} bytes (limit {NAME_MAX})", name.len()))?;
        let at = u32::try_from(self.0.len())
            .ok()
            .filter(|&at| at < KEY_NAME)
            .ok_or_else(|| "the names of the mount exceed 2 GiB".to_owned())?;
        self.0.push(len);
        self.0.extend_from_slice(name.as_bytes());
        Ok(at)
    }
}

/// Marks a node name that is not in the arena but is the last component of a TOC key: the rest
/// of the name is the key's binary index among all the tree's archives (see [`Names`]).
const KEY_NAME: u32 = 1 << 31;

/// The names of a tree's nodes. The directory a key ends in is named by the key's last
/// component, which the archive holds already (and keeps as long as the mount): such a name is
/// a reference to the key instead of a copy, which saves the arena one name per key (16 MB for a
/// million keys). Other names (shared upper directories, file names) are in the arena.
#[derive(Debug, Default)]
struct Names {
    arena: Arena,
    /// Each archive the tree shows, with the index its first binary has among all of them.
    sources: Vec<(u32, Arc<Archive>)>,
    /// The index the next archive's first binary gets.
    next_binary: u64,
}

impl Names {
    fn get(&self, name: u32) -> &[u8] {
        if name & KEY_NAME == 0 {
            return self.arena.get(name);
        }
        let binary = name & !KEY_NAME;
        let source = self.sources.partition_point(|&(first, _)| first <= binary) - 1;
        let (first, archive) = &self.sources[source];
        let key = archive
            .binary_key((binary - first) as usize)
            .expect("a key name refers to a binary of its archive");
        key.as_bytes()
            .rsplit(|&b| b == b'/')
            .next()
            .expect("rsplit yields at least one piece")
    }

    /// Records an archive whose keys may name directories; returns the index its first binary
    /// gets, when all of its binaries can be referred to.
    fn add_source(&mut self, archive: &Arc<Archive>) -> Option<u32> {
        let first = self.next_binary;
        self.next_binary += archive.binary_count() as u64;
        let first = u32::try_from(first)
            .ok()
            .filter(|_| self.next_binary <= u64::from(KEY_NAME))?;
        self.sources.push((first, Arc::clone(archive)));
        Some(first)
    }
}

/// The finished, immutable tree.
#[derive(Debug)]
pub struct Tree {
    recs: Vec<Rec>,
    names: Names,
    dirs: Vec<DirNode>,
    files: Vec<FileNode>,
    /// Node indices, one range per directory, each range sorted by name.
    children: Vec<u32>,
}

impl Tree {
    /// Number of real nodes (directories and files); link inodes come after them.
    pub fn len(&self) -> u64 {
        self.recs.len() as u64
    }

    fn rec(&self, ino: Ino) -> Option<Rec> {
        let i = usize::try_from(ino.checked_sub(1)?).ok()?;
        self.recs.get(i).copied()
    }

    /// What `ino` is, or `None` for a number this mount never handed out.
    pub fn entry(&self, ino: Ino) -> Option<Entry<'_>> {
        if let Some(rec) = self.rec(ino) {
            return Some(match rec.file() {
                Some(f) => Entry::File(&self.files[f]),
                None => Entry::Dir(&self.dirs[rec.slot as usize]),
            });
        }
        let target = ino.checked_sub(self.len())?;
        self.rec(target)?.file().map(|_| Entry::Link(target))
    }

    /// The name of a real node ("" for the root).
    pub fn name(&self, ino: Ino) -> Option<&str> {
        let rec = self.rec(ino)?;
        // Every name was pushed from a `&str`, so this never fails.
        std::str::from_utf8(self.names.get(rec.name)).ok()
    }

    /// The directory holding a real node (the root's parent is the root).
    pub fn parent(&self, ino: Ino) -> Option<Ino> {
        Some(Ino::from(self.rec(ino)?.parent) + 1)
    }

    /// The inode of the link to file `file`.
    pub fn link_to(&self, file: Ino) -> Ino {
        file + self.len()
    }

    fn range(&self, dir: &DirNode) -> &[u32] {
        &self.children[dir.first as usize..][..dir.count as usize]
    }

    /// A child by exact name.
    pub fn child(&self, dir: &DirNode, name: &str) -> Option<Ino> {
        let range = self.range(dir);
        range
            .binary_search_by(|&i| {
                self.names
                    .get(self.recs[i as usize].name)
                    .cmp(name.as_bytes())
            })
            .ok()
            .map(|at| Ino::from(range[at]) + 1)
    }

    /// The children of `dir` sorted by name: name, inode, and whether it is a directory.
    pub fn children<'a>(&'a self, dir: &DirNode) -> impl Iterator<Item = (&'a str, Ino, bool)> {
        self.range(dir).iter().map(move |&i| {
            let ino = Ino::from(i) + 1;
            let is_dir = self.recs[i as usize].dir().is_some();
            (self.name(ino).unwrap_or_default(), ino, is_dir)
        })
    }

    /// Every kernel file, in the order they were added.
    pub fn files(&self) -> &[FileNode] {
        &self.files
    }

    /// Resolves a `<target-id>.hsaco` name that is not an entry of `dir` with the loader's
    /// rules (feature subsets most specific first, then the generic target), trying only the
    /// kernel files present in `dir`. Returns the file it resolves to.
    pub fn fallback(&self, dir: &DirNode, name: &str) -> Option<Ino> {
        let target = names::arch_from_hsaco_name(name)?;
        if !dir.has_files() {
            return None;
        }
        let found = target_id::resolve_in(&target_id::device_arch_list(target), |candidate| {
            self.kernel_file(dir, &names::hsaco_name(candidate))
                .is_some()
        })?;
        self.kernel_file(dir, &names::hsaco_name(&found))
    }

    /// The kernel file named `file_name` in `dir`, if there is one.
    fn kernel_file(&self, dir: &DirNode, file_name: &str) -> Option<Ino> {
        let ino = self.child(dir, file_name)?;
        self.rec(ino)?.file().map(|_| ino)
    }
}

/// Finds nodes by (parent, name) while building: open addressing over node indices, with a
/// per-process random hash key so that crafted names cannot force long probe chains.
#[derive(Debug)]
struct Index {
    /// Node index + 1; 0 marks a free slot. Always a power of two, at most half full.
    slots: Vec<u32>,
    used: usize,
    hasher: RandomState,
}

impl Index {
    fn new() -> Index {
        Index {
            slots: vec![0; 1024],
            used: 0,
            hasher: RandomState::new(),
        }
    }

    fn hash(&self, parent: u32, name: &[u8]) -> usize {
        self.hasher.hash_one((parent, name)) as usize
    }

    /// The node named `name` under `parent`, or the free slot where it would go.
    fn find(&self, recs: &[Rec], names: &Names, parent: u32, name: &[u8]) -> Result<u32, usize> {
        let mask = self.slots.len() - 1;
        let mut at = self.hash(parent, name) & mask;
        loop {
            match self.slots[at] {
                0 => return Err(at),
                n => {
                    let rec = recs[n as usize - 1];
                    if rec.parent == parent && names.get(rec.name) == name {
                        return Ok(n - 1);
                    }
                }
            }
            at = (at + 1) & mask;
        }
    }

    /// Records node `node` in the free slot `at` that `find` returned.
    fn insert(&mut self, recs: &[Rec], names: &Names, at: usize, node: u32) {
        self.slots[at] = node + 1;
        self.used += 1;
        if self.used * 2 > self.slots.len() {
            self.rebuild(recs, names, self.slots.len() * 2);
        }
    }

    /// Makes room for `extra` more nodes at once: re-hashing every node touches all of them
    /// (cache misses on a large tree), so a builder that knows how many are coming sizes the
    /// index once.
    fn reserve(&mut self, recs: &[Rec], names: &Names, extra: usize) {
        let want = self
            .used
            .saturating_add(extra)
            .saturating_mul(2)
            .next_power_of_two();
        if want > self.slots.len() {
            self.rebuild(recs, names, want);
        }
    }

    fn rebuild(&mut self, recs: &[Rec], names: &Names, len: usize) {
        let mut grown = Index {
            slots: vec![0; len],
            used: 0,
            hasher: self.hasher.clone(),
        };
        for &n in self.slots.iter().filter(|&&n| n != 0) {
            let rec = recs[n as usize - 1];
            let free = grown
                .find(recs, names, rec.parent, names.get(rec.name))
                .expect_err("each node is indexed once");
            grown.slots[free] = n;
            grown.used += 1;
        }
        *self = grown;
    }
}

/// Collects archives into a tree.
#[derive(Debug)]
pub struct TreeBuilder {
    recs: Vec<Rec>,
    names: Names,
    dirs: Vec<DirNode>,
    files: Vec<FileNode>,
    index: Index,
    /// Arena offset of each arch's file name, or why the arch cannot be shown.
    arch_names: HashMap<String, Result<u32, String>>,
}

impl Default for TreeBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl TreeBuilder {
    pub fn new() -> Self {
        let mut names = Names::default();
        let root = names.arena.push("").expect("the empty name fits");
        TreeBuilder {
            recs: vec![Rec {
                parent: 0,
                name: root,
                slot: 0,
            }],
            names,
            dirs: vec![DirNode::default()],
            files: Vec::new(),
            index: Index::new(),
            arch_names: HashMap::new(),
        }
    }

    /// Adds the entries of `archive` (index `id` in the mount's archive list) whose keys `keep`
    /// accepts (a HIPK binary's mount shows that binary's keys only; skipped keys are not
    /// checked). Returns the entries an earlier archive already provided; fails, naming the key,
    /// on a name that cannot be shown safely or that collides with a directory.
    pub fn add_archive_keys(
        &mut self,
        id: u32,
        archive: &Arc<Archive>,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Duplicate>, TreeError> {
        let mut duplicates = Vec::new();
        let first_binary = self.names.add_source(archive);
        let err = |key: &str, reason: String| TreeError {
            archive: archive.path().display().to_string(),
            key: key.to_owned(),
            reason,
        };
        // Each kept key adds at most its leaf directory and one file per arch (the directories
        // above are mostly shared); only a key's new upper directories can go beyond this.
        let (keys, files) = archive
            .binaries()
            .filter(|b| keep(b.key))
            .fold((0, 0), |(k, f), b| (k + 1, f + b.len()));
        self.recs.reserve(keys + files);
        self.files.reserve(files);
        self.dirs.reserve(keys);
        self.index.reserve(&self.recs, &self.names, keys + files);
        // The directories of the previous key: TOC keys are sorted, so neighbours share most of
        // their path and only the components that differ need the index.
        let mut path: Vec<(&str, u32)> = Vec::new();
        for (bi, binary) in archive.binaries().enumerate() {
            let key = binary.key;
            if !keep(key) {
                continue;
            }
            let components = names::key_components(key).map_err(|r| err(key, r))?;
            let shared = path
                .iter()
                .zip(&components)
                .take_while(|((have, _), want)| have == *want)
                .count();
            path.truncate(shared);
            for (i, comp) in components.iter().enumerate().skip(shared) {
                let parent = path.last().map_or(0, |&(_, d)| d);
                let last = i + 1 == components.len();
                let key_name = first_binary
                    .filter(|_| last)
                    .map(|first| KEY_NAME | (first + bi as u32));
                let dir = self
                    .subdir(parent, comp, key_name)
                    .map_err(|r| err(key, r))?;
                path.push((comp, dir));
            }
            let dir = path.last().map_or(0, |&(_, d)| d);
            for (ei, entry) in binary.arches().enumerate() {
                let name = self.arch_name(entry.arch).map_err(|r| err(key, r))?;
                let found = self
                    .index
                    .find(&self.recs, &self.names, dir, self.names.get(name));
                let free = match found {
                    Err(free) => free,
                    Ok(existing) => match self.recs[existing as usize].file() {
                        Some(f) => {
                            duplicates.push(Duplicate {
                                key: key.to_owned(),
                                arch: entry.arch.to_owned(),
                                kept: self.files[f].archive,
                                dropped: id,
                            });
                            continue;
                        }
                        None => {
                            let shown = String::from_utf8_lossy(self.names.get(name)).into_owned();
                            return Err(err(
                                key,
                                format!("file {shown} would replace a directory of the same name"),
                            ));
                        }
                    },
                };
                let (size, stored_size) = match archive.sizes_at(bi, ei) {
                    Ok((size, stored)) => (size, stored.size),
                    // The entry points at nothing usable. Show it with the size it claims (the
                    // blob's for `none`, else the TOC's); reading it gives EIO, with the reason
                    // in the log.
                    Err(Error::BlobOutOfBounds { size, .. }) => (size, size),
                    Err(_) => (entry.original_size, 0),
                };
                let slot = u32::try_from(self.files.len())
                    .ok()
                    .filter(|&s| s < FILE)
                    .ok_or_else(|| err(key, "too many files in one mount".into()))?;
                self.files.push(FileNode {
                    archive: id,
                    binary: bi as u32,
                    entry: ei as u32,
                    ordinal: entry.ordinal,
                    size,
                    stored_size,
                });
                self.push(dir, name, slot | FILE, free)
                    .map_err(|r| err(key, r))?;
                self.dirs[self.recs[dir as usize].slot as usize].subdirs |= HAS_FILES;
            }
        }
        Ok(duplicates)
    }

    /// The arena offset of the file name for `arch`, checked and stored once per arch.
    fn arch_name(&mut self, arch: &str) -> Result<u32, String> {
        if let Some(known) = self.arch_names.get(arch) {
            return known.clone();
        }
        let named =
            names::check_arch(arch).and_then(|()| self.names.arena.push(&names::hsaco_name(arch)));
        self.arch_names.insert(arch.to_owned(), named.clone());
        named
    }

    /// Appends a node under `parent` into the free index slot `free`.
    fn push(&mut self, parent: u32, name: u32, slot: u32, free: usize) -> Result<u32, String> {
        if self.recs.len() >= MAX_NODES {
            return Err(format!(
                "the mount would hold more than {MAX_NODES} entries"
            ));
        }
        let node = self.recs.len() as u32;
        self.recs.push(Rec { parent, name, slot });
        self.index.insert(&self.recs, &self.names, free, node);
        Ok(node)
    }

    /// The directory `name` under `parent`, created if missing. `key_name`, when given, names
    /// it without a copy (see [`Names`]).
    fn subdir(&mut self, parent: u32, name: &str, key_name: Option<u32>) -> Result<u32, String> {
        match self
            .index
            .find(&self.recs, &self.names, parent, name.as_bytes())
        {
            Ok(node) if self.recs[node as usize].dir().is_some() => Ok(node),
            Ok(_) => Err(format!(
                "directory {name} would replace a kernel file of the same name"
            )),
            Err(free) => {
                let at = match key_name {
                    Some(at) => at,
                    None => self.names.arena.push(name)?,
                };
                let slot = u32::try_from(self.dirs.len())
                    .map_err(|_| "too many directories".to_owned())?;
                let node = self.push(parent, at, slot, free)?;
                self.dirs.push(DirNode::default());
                self.dirs[self.recs[parent as usize].slot as usize].subdirs += 1;
                Ok(node)
            }
        }
    }

    /// Freezes the tree. `gpus` are the local device ISAs in order: each directory holding
    /// kernels gets a `native.hsaco` link to what the first GPU that resolves there would load.
    pub fn finish(self, gpus: &[String]) -> Tree {
        let TreeBuilder {
            mut recs,
            mut names,
            mut dirs,
            mut files,
            index,
            ..
        } = self;
        drop(index);
        // Give back what the vectors reserved beyond their use (up to half of each).
        recs.shrink_to_fit();
        names.arena.0.shrink_to_fit();
        dirs.shrink_to_fit();
        files.shrink_to_fit();
        // Group the children by parent (a counting sort), then sort each group by name.
        for rec in &recs[1..] {
            dirs[recs[rec.parent as usize].slot as usize].count += 1;
        }
        let mut next = 0u32;
        for d in &mut dirs {
            d.first = next;
            next += d.count;
        }
        let mut fill: Vec<u32> = dirs.iter().map(|d| d.first).collect();
        let mut children = vec![0u32; recs.len() - 1];
        for (i, rec) in recs.iter().enumerate().skip(1) {
            let at = &mut fill[recs[rec.parent as usize].slot as usize];
            children[*at as usize] = i as u32;
            *at += 1;
        }
        drop(fill);
        for d in &dirs {
            children[d.first as usize..][..d.count as usize].sort_unstable_by(|&a, &b| {
                names
                    .get(recs[a as usize].name)
                    .cmp(names.get(recs[b as usize].name))
            });
        }
        let mut tree = Tree {
            recs,
            names,
            dirs,
            files,
            children,
        };
        // Each GPU's candidate file names, most preferred first, worked out once for all
        // directories with the loader's resolution order.
        let candidates: Vec<Vec<String>> = gpus
            .iter()
            .map(|gpu| {
                let mut order = Vec::new();
                target_id::resolve_in(&target_id::device_arch_list(gpu), |c| {
                    order.push(names::hsaco_name(c));
                    false
                });
                order
            })
            .collect();
        if candidates.is_empty() {
            return tree;
        }
        let natives: Vec<(usize, u32)> = tree
            .dirs
            .iter()
            .enumerate()
            .filter_map(|(i, d)| {
                // A real entry of that name wins over the link.
                if !d.has_files() || tree.child(d, NATIVE).is_some() {
                    return None;
                }
                let target = candidates
                    .iter()
                    .find_map(|order| order.iter().find_map(|n| tree.kernel_file(d, n)))?;
                Some((i, target as u32))
            })
            .collect();
        for (i, target) in natives {
            tree.dirs[i].native = target;
        }
        tree
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names_are_checked_and_stored_once() {
        let mut b = TreeBuilder::new();
        let at = b.arch_name("gfx942:sramecc+:xnack-").unwrap();
        assert_eq!(b.names.get(at), b"gfx942:sramecc+:xnack-.hsaco");
        let len = b.names.arena.0.len();
        assert_eq!(b.arch_name("gfx942:sramecc+:xnack-").unwrap(), at);
        assert_eq!(b.names.arena.0.len(), len, "a second use adds no bytes");
        for bad in ["", ".", "..", "gfx/900", "gfx\0", &"g".repeat(250)] {
            assert!(b.arch_name(bad).is_err(), "{bad:?} must be refused");
            assert!(b.arch_name(bad).is_err(), "{bad:?} must stay refused");
        }
        assert!(b.arch_name(&"g".repeat(249)).is_ok());
    }

    fn dir_of(tree: &Tree, ino: Ino) -> DirNode {
        match tree.entry(ino) {
            Some(Entry::Dir(d)) => d.clone(),
            other => panic!("{ino} is {other:?}"),
        }
    }

    #[test]
    fn key_directories_are_named_by_their_keys_without_a_copy() {
        use crate::archive::writer::{ArchiveWriter, Compression};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.kpack");
        let mut w = ArchiveWriter::new("g", "f", vec!["gfx942".into()], Compression::None).unwrap();
        let keys = ["lib/a.so#0", "lib/b.so#0", "lib/sub/c.so#1", "top#0"];
        for key in keys {
            w.add_kernel(key, "gfx942", key.as_bytes().to_vec())
                .unwrap();
        }
        w.write(&path, &|_| {}).unwrap();
        let archive = Arc::new(Archive::open(&path).unwrap());
        let mut b = TreeBuilder::new();
        assert_eq!(b.add_archive_keys(0, &archive, &|_| true).unwrap(), []);
        // The same keys again: the second archive's binaries are numbered after the first's.
        let dups = b.add_archive_keys(1, &archive, &|_| true).unwrap();
        assert_eq!(dups.len(), 4);
        assert_eq!((dups[2].kept, dups[2].dropped), (0, 1));
        let arena = String::from_utf8_lossy(&b.names.arena.0).into_owned();
        for leaf in ["a.so#0", "b.so#0", "c.so#1", "top#0"] {
            assert!(!arena.contains(leaf), "{leaf} was copied: {arena:?}");
        }
        assert!(arena.contains("lib") && arena.contains("sub"), "{arena:?}");
        let tree = b.finish(&[]);
        let root = dir_of(&tree, ROOT);
        let names = |d: &DirNode| tree.children(d).map(|c| c.0).collect::<Vec<_>>();
        assert_eq!(names(&root), ["lib", "top#0"]);
        let lib = dir_of(&tree, tree.child(&root, "lib").unwrap());
        assert_eq!(names(&lib), ["a.so#0", "b.so#0", "sub"]);
        assert_eq!((lib.subdirs(), lib.has_files()), (3, false));
        let sub = dir_of(&tree, tree.child(&lib, "sub").unwrap());
        let c = tree.child(&sub, "c.so#1").unwrap();
        assert_eq!(tree.name(c), Some("c.so#1"));
        let c_dir = dir_of(&tree, c);
        assert_eq!((c_dir.subdirs(), c_dir.has_files()), (0, true));
        let f = tree.child(&c_dir, "gfx942.hsaco").unwrap();
        match tree.entry(f) {
            Some(Entry::File(file)) => assert_eq!((file.archive, file.size), (0, 14)),
            other => panic!("{other:?}"),
        }
        assert_eq!(tree.child(&lib, "c.so#1"), None);
    }

    #[test]
    fn the_index_finds_every_node_after_growing() {
        let mut b = TreeBuilder::new();
        let mut made = Vec::new();
        // Seven directories in the root, seven in each of those, and so on.
        let parent = |made: &[u32], i: usize| if i < 7 { 0 } else { made[i / 7 - 1] };
        for i in 0..5000 {
            let p = parent(&made, i);
            made.push(b.subdir(p, &format!("d{i}"), None).unwrap());
        }
        assert!(b.index.slots.len() > 1024, "the index grew");
        for (i, &node) in made.iter().enumerate() {
            let p = parent(&made, i);
            assert_eq!(b.subdir(p, &format!("d{i}"), None), Ok(node));
        }
        assert_eq!(b.recs.len(), 5001, "finding adds nothing");
        let tree = b.finish(&[]);
        let root = match tree.entry(ROOT) {
            Some(Entry::Dir(d)) => d.clone(),
            other => panic!("root is {other:?}"),
        };
        assert_eq!(root.count, 7);
        assert_eq!(root.subdirs(), 7);
        assert_eq!(
            tree.children(&root).map(|c| c.0).collect::<Vec<_>>(),
            ["d0", "d1", "d2", "d3", "d4", "d5", "d6"]
        );
        let d3 = tree.child(&root, "d3").unwrap();
        assert_eq!(tree.name(d3), Some("d3"));
        assert_eq!(tree.parent(d3), Some(ROOT));
        assert_eq!(tree.parent(ROOT), Some(ROOT));
        assert_eq!(tree.child(&root, "d7"), None);
    }
}
