//! The `umount2(2)` call, for the `unmount` command, the signal handler's lazy detach and the
//! daemon's clean-up after a failed start. Its own module so that `mount` and `daemon.rs`
//! both use it without depending on each other in a circle.

use std::io;
use std::path::Path;

/// `umount2(path, flags)`; the OS error when it fails.
pub fn umount2(path: &Path, flags: libc::c_int) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
