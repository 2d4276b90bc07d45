//! The namespace: lookups (with `native.hsaco` and fallback links), attributes, access checks,
//! links, directory listings, extended attributes and `statfs`, all answered from the tree
//! built at mount time, without decoding anything.

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use super::errno::Errno;
use super::tree::{self, Entry, FileNode, Ino, NATIVE, ROOT};
use super::{Attr, BLKSIZE, DirSink, Kind, KpackFs, Lookup, StatFs};

impl KpackFs {
    pub(in crate::fs) fn file_time(&self, f: &FileNode) -> SystemTime {
        self.archive_of(f)
            .modified()
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }

    pub(in crate::fs) fn attr_of(&self, ino: Ino, entry: Entry<'_>) -> Attr {
        let (kind, size, perm, nlink, mtime) = match entry {
            Entry::Dir(d) => (Kind::Dir, 0, 0o555, 2 + d.subdirs(), self.dir_time),
            Entry::File(f) => (Kind::File, f.size, 0o444, 1, self.file_time(f)),
            Entry::Link(target) => {
                let name_len = self.tree.name(target).map_or(0, |n| n.len() as u64);
                (Kind::Symlink, name_len, 0o777, 1, self.dir_time)
            }
        };
        Attr {
            ino,
            kind,
            size,
            blocks: size.div_ceil(512),
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            mtime,
            blksize: BLKSIZE,
        }
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr, Errno> {
        let entry = self.tree.entry(ino).ok_or(Errno::ENOENT)?;
        Ok(self.attr_of(ino, entry))
    }

    /// `access(2)` on `ino`, from the modes the tree shows: the mount is mounted without
    /// `default_permissions` (every mode is readable by all, so the kernel's check of each path
    /// component costs time and decides nothing), which sends `access` here. Writing is EROFS;
    /// executing needs an execute bit, as the kernel would require.
    pub fn access(&self, ino: Ino, write: bool, exec: bool) -> Result<(), Errno> {
        let attr = self.getattr(ino)?;
        if write {
            Err(Errno::EROFS)
        } else if exec && attr.perm & 0o111 == 0 {
            Err(Errno::EACCES)
        } else {
            Ok(())
        }
    }

    /// Looks `name` up in directory `parent`: an entry, `native.hsaco`, or a fallback link.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Lookup, Errno> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let found = self.resolve(parent, name);
        if let Ok(Lookup::Missing) = found {
            self.lookups_missing.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    pub(in crate::fs) fn resolve(&self, parent: Ino, name: &[u8]) -> Result<Lookup, Errno> {
        let dir = match self.tree.entry(parent).ok_or(Errno::ENOENT)? {
            Entry::Dir(d) => d,
            _ => return Err(Errno::ENOTDIR),
        };
        let Ok(name) = std::str::from_utf8(name) else {
            return Ok(Lookup::Missing);
        };
        let ino = if let Some(ino) = self.tree.child(dir, name) {
            ino
        } else if let (NATIVE, Some(target)) = (name, dir.native()) {
            self.tree.link_to(target)
        } else if let Some(target) = self.tree.fallback(dir, name) {
            self.tree.link_to(target)
        } else {
            return Ok(Lookup::Missing);
        };
        self.getattr(ino).map(Lookup::Found)
    }

    /// The target of a link: the sibling file's name.
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>, Errno> {
        match self.tree.entry(ino).ok_or(Errno::ENOENT)? {
            Entry::Link(target) => Ok(self
                .tree
                .name(target)
                .ok_or(Errno::EIO)?
                .as_bytes()
                .to_vec()),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Lists a directory from `offset` (0 = start; each entry carries the offset of the next).
    pub fn readdir(&self, ino: Ino, offset: u64, sink: &mut dyn DirSink) -> Result<(), Errno> {
        let dir = match self.tree.entry(ino).ok_or(Errno::ENOENT)? {
            Entry::Dir(d) => d,
            _ => return Err(Errno::ENOTDIR),
        };
        let parent = self.tree.parent(ino).unwrap_or(ROOT);
        let fixed = [(".", ino, Kind::Dir), ("..", parent, Kind::Dir)];
        let children = self.tree.children(dir).map(|(name, child, is_dir)| {
            (name, child, if is_dir { Kind::Dir } else { Kind::File })
        });
        let native = dir
            .native()
            .map(|t| (NATIVE, self.tree.link_to(t), Kind::Symlink));
        let all = fixed.into_iter().chain(children).chain(native);
        for (i, (name, child, kind)) in all.enumerate().skip(offset as usize) {
            if sink.add(child, i as u64 + 1, kind, name) {
                break;
            }
        }
        Ok(())
    }

    /// The extended attributes of an inode, in listing order.
    pub(in crate::fs) fn xattrs(&self, ino: Ino) -> Vec<(&'static str, Vec<u8>)> {
        match self.tree.entry(ino) {
            Some(Entry::Dir(_)) if ino == ROOT => {
                let mut attrs = vec![("user.kpack.stats", self.stats_text().into_bytes())];
                // Where the mount's decoded kernels take disk (none with memory backing).
                if let Some(dir) = self.store.backing_dir() {
                    let path = dir.as_os_str().as_encoded_bytes().to_vec();
                    attrs.push(("user.kpack.backing_dir", path));
                }
                attrs
            }
            Some(Entry::File(f)) => {
                let archive = self.archive_of(f);
                let (key, arch) = self.names_of(f);
                let mut attrs = vec![
                    (
                        "user.kpack.archive",
                        archive.path().as_os_str().as_encoded_bytes().to_vec(),
                    ),
                    ("user.kpack.arch", arch.as_bytes().to_vec()),
                    ("user.kpack.key", key.as_bytes().to_vec()),
                    (
                        "user.kpack.scheme",
                        archive.scheme().name().as_bytes().to_vec(),
                    ),
                    ("user.kpack.ordinal", f.ordinal.to_string().into_bytes()),
                    (
                        "user.kpack.stored_size",
                        f.stored_size.to_string().into_bytes(),
                    ),
                ];
                // Archives we write record each kernel's digest; reference archives do not.
                if let Ok(Some(d)) = self.digest_of(f) {
                    attrs.push(("user.kpack.blake3", crate::error::hex(&d).into_bytes()));
                }
                attrs
            }
            _ => Vec::new(),
        }
    }

    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> Result<Vec<u8>, Errno> {
        if self.tree.entry(ino).is_none() {
            return Err(Errno::ENOENT);
        }
        self.xattrs(ino)
            .into_iter()
            .find(|(n, _)| n.as_bytes() == name)
            .map(|(_, v)| v)
            .ok_or(Errno::ENODATA)
    }

    /// Attribute names, each followed by a NUL, as `listxattr(2)` returns them.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<u8>, Errno> {
        if self.tree.entry(ino).is_none() {
            return Err(Errno::ENOENT);
        }
        let mut out = Vec::new();
        for (name, _) in self.xattrs(ino) {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    pub fn statfs(&self) -> StatFs {
        const BSIZE: u32 = 4096;
        let bytes: u64 = self
            .tree
            .files()
            .iter()
            .map(|f| f.size.div_ceil(u64::from(BSIZE)))
            .sum();
        StatFs {
            blocks: bytes,
            files: self.tree.len(),
            bsize: BSIZE,
            namelen: tree::NAME_MAX as u32,
            frsize: BSIZE,
        }
    }
}
