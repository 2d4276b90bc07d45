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
//! The builder takes archives one at a time so that a mount can merge several of them; the
//! first archive to provide a (key, arch) wins and later ones are reported as duplicates.

use std::collections::BTreeMap;
use std::fmt;

use crate::arch;
use crate::archive::Archive;
use crate::error::Error;
use crate::names;

pub type Ino = u64;

/// The root directory's inode number (fixed by FUSE).
pub const ROOT: Ino = 1;

/// The name of the link to the kernel the local GPU would load.
pub const NATIVE: &str = "native.hsaco";

/// Longest file name Linux accepts.
pub const NAME_MAX: usize = names::NAME_MAX;

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

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirNode {
    /// Children sorted by name (byte order), for binary search and stable readdir.
    pub children: Vec<(Box<str>, Ino)>,
    /// The file `native.hsaco` links to, when a GPU resolves here.
    pub native: Option<Ino>,
    /// Number of child directories (for `nlink`).
    pub subdirs: u32,
    /// Whether any child is a kernel file (only those directories answer fallback names).
    pub has_files: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    Dir(DirNode),
    File(FileNode),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub parent: Ino,
    pub name: Box<str>,
    pub kind: NodeKind,
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

/// The finished, immutable tree.
#[derive(Debug)]
pub struct Tree {
    nodes: Vec<Node>,
}

impl Tree {
    /// Number of real nodes (directories and files); link inodes come after them.
    pub fn len(&self) -> u64 {
        self.nodes.len() as u64
    }

    /// Never: the root directory always exists.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The node behind a real inode number.
    pub fn node(&self, ino: Ino) -> Option<&Node> {
        let i = usize::try_from(ino.checked_sub(1)?).ok()?;
        self.nodes.get(i)
    }

    /// What `ino` is, or `None` for a number this mount never handed out.
    pub fn entry(&self, ino: Ino) -> Option<Entry<'_>> {
        if let Some(node) = self.node(ino) {
            return Some(match &node.kind {
                NodeKind::Dir(d) => Entry::Dir(d),
                NodeKind::File(f) => Entry::File(f),
            });
        }
        let target = ino.checked_sub(self.len())?;
        match self.node(target)?.kind {
            NodeKind::File(_) => Some(Entry::Link(target)),
            NodeKind::Dir(_) => None,
        }
    }

    /// The inode of the link to file `file`.
    pub fn link_to(&self, file: Ino) -> Ino {
        file + self.len()
    }

    /// A child by exact name.
    pub fn child(&self, dir: &DirNode, name: &str) -> Option<Ino> {
        dir.children
            .binary_search_by(|(n, _)| n.as_ref().cmp(name))
            .ok()
            .map(|i| dir.children[i].1)
    }

    /// Every real node, in inode order (inode = index + 1).
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Resolves a `<target-id>.hsaco` name that is not an entry of `dir` with the loader's
    /// rules (feature subsets most specific first, then the generic target), trying only the
    /// kernel files present in `dir`. Returns the file it resolves to.
    pub fn fallback(&self, dir: &DirNode, name: &str) -> Option<Ino> {
        let target = names::arch_from_hsaco_name(name)?;
        if !dir.has_files {
            return None;
        }
        let found = arch::resolve_in(&arch::device_arch_list(target), |candidate| {
            self.kernel_file(dir, candidate).is_some()
        })?;
        self.kernel_file(dir, &found)
    }

    /// The kernel file for `arch` in `dir`, if there is one.
    fn kernel_file(&self, dir: &DirNode, arch: &str) -> Option<Ino> {
        let ino = self.child(dir, &names::hsaco_name(arch))?;
        matches!(self.node(ino)?.kind, NodeKind::File(_)).then_some(ino)
    }
}

/// Collects archives into a tree.
#[derive(Debug)]
pub struct TreeBuilder {
    nodes: Vec<Node>,
    /// Children by name while building (turned into sorted vectors at the end).
    children: Vec<BTreeMap<Box<str>, Ino>>,
}

impl Default for TreeBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl TreeBuilder {
    pub fn new() -> Self {
        TreeBuilder {
            nodes: vec![Node {
                parent: ROOT,
                name: "".into(),
                kind: NodeKind::Dir(DirNode::default()),
            }],
            children: vec![BTreeMap::new()],
        }
    }

    /// Adds every entry of `archive` (index `id` in the mount's archive list). Returns the
    /// entries an earlier archive already provided; fails, naming the key, on a name that
    /// cannot be shown safely or that collides with a directory.
    pub fn add_archive(&mut self, id: u32, archive: &Archive) -> Result<Vec<Duplicate>, TreeError> {
        self.add_archive_keys(id, archive, &|_| true)
    }

    /// Like [`TreeBuilder::add_archive`], with only the keys for which `keep` is true (a HIPK
    /// binary's mount shows that binary's keys only). Skipped keys are not checked.
    pub fn add_archive_keys(
        &mut self,
        id: u32,
        archive: &Archive,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Duplicate>, TreeError> {
        let mut duplicates = Vec::new();
        let err = |key: &str, reason: String| TreeError {
            archive: archive.path().display().to_string(),
            key: key.to_owned(),
            reason,
        };
        for (bi, binary) in archive.binaries().iter().enumerate() {
            let key = binary.key.as_str();
            if !keep(key) {
                continue;
            }
            let components = names::key_components(key).map_err(|r| err(key, r))?;
            let mut dir = ROOT;
            for comp in components {
                dir = self.subdir(dir, comp).map_err(|r| err(key, r))?;
            }
            for (ei, entry) in binary.arches.iter().enumerate() {
                let name = validate_arch(&entry.arch).map_err(|r| err(key, r))?;
                if let Some(&existing) = self.children[dir as usize - 1].get(name.as_str()) {
                    match &self.nodes[existing as usize - 1].kind {
                        NodeKind::File(f) => {
                            duplicates.push(Duplicate {
                                key: key.to_owned(),
                                arch: entry.arch.clone(),
                                kept: f.archive,
                                dropped: id,
                            });
                            continue;
                        }
                        NodeKind::Dir(_) => {
                            return Err(err(
                                key,
                                format!("file {name} would replace a directory of the same name"),
                            ));
                        }
                    }
                }
                let (size, stored_size) = match archive.locate(key, &entry.arch) {
                    Ok(k) => (k.size, k.stored.size),
                    // The entry points at nothing usable. Show it with the size it claims (the
                    // blob's for `none`, else the TOC's); reading it gives EIO, with the reason
                    // in the log.
                    Err(Error::BlobOutOfBounds { size, .. }) => (size, size),
                    Err(_) => (entry.original_size, 0),
                };
                let file = FileNode {
                    archive: id,
                    binary: bi as u32,
                    entry: ei as u32,
                    ordinal: entry.ordinal,
                    size,
                    stored_size,
                };
                let ino = self.push(dir, name.into(), NodeKind::File(file));
                self.children[dir as usize - 1]
                    .insert(self.nodes[ino as usize - 1].name.clone(), ino);
                if let NodeKind::Dir(d) = &mut self.nodes[dir as usize - 1].kind {
                    d.has_files = true;
                }
            }
        }
        Ok(duplicates)
    }

    fn push(&mut self, parent: Ino, name: Box<str>, kind: NodeKind) -> Ino {
        self.nodes.push(Node { parent, name, kind });
        self.children.push(BTreeMap::new());
        self.nodes.len() as Ino
    }

    /// The directory `name` under `parent`, created if missing.
    fn subdir(&mut self, parent: Ino, name: &str) -> Result<Ino, String> {
        if let Some(&ino) = self.children[parent as usize - 1].get(name) {
            return match self.nodes[ino as usize - 1].kind {
                NodeKind::Dir(_) => Ok(ino),
                NodeKind::File(_) => Err(format!(
                    "directory {name} would replace a kernel file of the same name"
                )),
            };
        }
        let ino = self.push(parent, name.into(), NodeKind::Dir(DirNode::default()));
        self.children[parent as usize - 1].insert(name.into(), ino);
        if let NodeKind::Dir(d) = &mut self.nodes[parent as usize - 1].kind {
            d.subdirs += 1;
        }
        Ok(ino)
    }

    /// Freezes the tree. `gpus` are the local device ISAs in order: each directory holding
    /// kernels gets a `native.hsaco` link to what the first GPU that resolves there would load.
    pub fn finish(mut self, gpus: &[String]) -> Tree {
        for (i, map) in std::mem::take(&mut self.children).into_iter().enumerate() {
            if let NodeKind::Dir(d) = &mut self.nodes[i].kind {
                d.children = map.into_iter().collect();
            }
        }
        let mut tree = Tree { nodes: self.nodes };
        let natives: Vec<(usize, Ino)> = tree
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, node)| {
                let NodeKind::Dir(d) = &node.kind else {
                    return None;
                };
                // A real entry of that name wins over the link.
                if !d.has_files || tree.child(d, NATIVE).is_some() {
                    return None;
                }
                let target = gpus.iter().find_map(|gpu| {
                    let found = arch::resolve_in(&arch::device_arch_list(gpu), |c| {
                        tree.kernel_file(d, c).is_some()
                    })?;
                    tree.kernel_file(d, &found)
                })?;
                Some((i, target))
            })
            .collect();
        for (i, target) in natives {
            if let NodeKind::Dir(d) = &mut tree.nodes[i].kind {
                d.native = Some(target);
            }
        }
        tree
    }
}

/// Splits a key into its directory names (the shared naming rules of `names`).
/// The file name for an arch, refusing arch names that cannot be one.
fn validate_arch(arch: &str) -> Result<String, String> {
    names::check_arch(arch)?;
    Ok(names::hsaco_name(arch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_unsafe_arches() {
        assert_eq!(
            validate_arch("gfx942:sramecc+:xnack-").unwrap(),
            "gfx942:sramecc+:xnack-.hsaco"
        );
        for bad in ["", ".", "..", "gfx/900", "gfx\0", &"g".repeat(250)] {
            assert!(validate_arch(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(validate_arch(&"g".repeat(249)).is_ok());
    }
}
