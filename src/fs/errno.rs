//! The error numbers readers of the mount see ([`Errno`]), and the one mapping to them from
//! errors of the core and of the mount's own files. A leaf: every part of `fs/` may name it.

/// A POSIX error number, as the kernel expects it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const ENOMEM: Errno = Errno(libc::ENOMEM);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const EROFS: Errno = Errno(libc::EROFS);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
}

/// What a reader of the mount sees for an error of the core: an allocation that failed is
/// ENOMEM; everything else (a corrupt or changed archive, an I/O error, a kernel that fails its
/// digest) is EIO for that file.
impl From<&crate::Error> for Errno {
    fn from(e: &crate::Error) -> Errno {
        match e.kind() {
            crate::ErrorKind::OutOfMemory => Errno::ENOMEM,
            _ => Errno::EIO,
        }
    }
}

/// What a reader of the mount sees for an error of the mount's own files (backing files, the
/// cache directory): ENOSPC and ENOMEM keep their meaning, as the reader can do something about
/// them; anything else is EIO.
impl From<&std::io::Error> for Errno {
    fn from(e: &std::io::Error) -> Errno {
        match e.raw_os_error() {
            Some(libc::ENOSPC) => Errno(libc::ENOSPC),
            Some(libc::ENOMEM) => Errno::ENOMEM,
            _ => Errno::EIO,
        }
    }
}
