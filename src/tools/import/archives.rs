//! Which archive each code object goes to while `pack --from-fatbin` and `split` stream a
//! host's code objects into archives: one per arch named `<prefix>_<arch>.kpack`, or a single
//! `<prefix>.kpack`. Archives open in first-seen arch order and record the arches and the
//! binaries they hold (for the family name and the pins). Where the files come from (a staging
//! area) stays with the caller.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::Tag;
use crate::archive::writer::Compression;
use crate::host::fatbin::archive_file_name;
use crate::tools::pack_pipeline::{ArchiveFile, Encoded, Finished};

/// An archive being written.
struct OpenArchive {
    pub path: PathBuf,
    /// In first-seen order.
    pub arches: Vec<String>,
    pub file: ArchiveFile,
    /// The `kernel_name`s of the binaries it holds code objects of, in first-seen order.
    pub kernel_names: Vec<String>,
}

/// The archives of one run, in the order they were opened.
pub struct ArchiveSet {
    dir: PathBuf,
    prefix: String,
    single: bool,
    compression: Compression,
    reference_layout: bool,
    open: Vec<OpenArchive>,
}

impl ArchiveSet {
    /// Archives go in `dir`; `single` puts every arch in one.
    pub fn new(
        dir: &Path,
        prefix: &str,
        single: bool,
        compression: Compression,
        reference_layout: bool,
    ) -> ArchiveSet {
        ArchiveSet {
            dir: dir.to_path_buf(),
            prefix: prefix.to_owned(),
            single,
            compression,
            reference_layout,
            open: Vec::new(),
        }
    }

    /// Appends one encoded code object to its archive, its bundler triple recorded as the
    /// entry's `target`. The first code object of an archive has its file made by `create`.
    pub fn append<E: From<crate::Error>>(
        &mut self,
        tag: Tag,
        encoded: Encoded,
        create: impl FnOnce(&Path) -> Result<File, E>,
    ) -> Result<(), E> {
        let name = archive_file_name(&self.prefix, (!self.single).then_some(&*tag.arch));
        let slot = match self
            .open
            .iter()
            .position(|a| a.path.file_name() == Some(name.as_ref()))
        {
            Some(i) => i,
            None => {
                let path = self.dir.join(&name);
                let file = create(&path)?;
                let file = ArchiveFile::new(file, &path, self.compression, self.reference_layout);
                self.open.push(OpenArchive {
                    path,
                    arches: Vec::new(),
                    file,
                    kernel_names: Vec::new(),
                });
                self.open.len() - 1
            }
        };
        let archive = &mut self.open[slot];
        if !archive.arches.contains(&tag.arch) {
            archive.arches.push(tag.arch.clone());
        }
        if !archive.kernel_names.contains(&tag.kernel_name) {
            archive.kernel_names.push(tag.kernel_name);
        }
        let meta = vec![("target".to_owned(), tag.triple)];
        archive.file.append(&tag.key, &tag.arch, meta, encoded)?;
        Ok(())
    }

    /// Writes each archive's TOC and header (group name the prefix, family its arches joined
    /// by `,`), in the order they were opened; sealing the files is the caller's.
    pub fn finish(self) -> crate::Result<Vec<FinishedArchive>> {
        let prefix = self.prefix;
        self.open
            .into_iter()
            .map(|a| {
                let count = a.file.len();
                let done = a.file.finish(&prefix, &a.arches.join(","), &a.arches)?;
                Ok(FinishedArchive {
                    path: a.path,
                    arches: a.arches,
                    kernel_names: a.kernel_names,
                    count,
                    done,
                })
            })
            .collect()
    }
}

/// An archive written in full, not yet sealed.
pub struct FinishedArchive {
    pub path: PathBuf,
    /// In first-seen order.
    pub arches: Vec<String>,
    /// The `kernel_name`s of the binaries it holds code objects of, in first-seen order.
    pub kernel_names: Vec<String>,
    /// Code objects it holds.
    pub count: usize,
    pub done: Finished,
}
