//! Build script: gives the C library its SONAME and leaves the `librocm_kpack.so.0` link that a
//! program linked against that SONAME looks for at run time.
//!
//! The link points at `librocm_kpack.so` in the profile directory (`target/<profile>/`, or
//! `target/<triple>/<profile>/` when cross-compiling). That directory is three levels above
//! `OUT_DIR` (`<profile>/build/<pkg>-<hash>/out`). The link is relative and may dangle until the
//! linker writes the library at the end of the same build.

use std::path::Path;

const SONAME: &str = "librocm_kpack.so.0";
const LIBRARY: &str = "librocm_kpack.so";

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os != "linux" {
        return;
    }
    println!("cargo::rustc-cdylib-link-arg=-Wl,-soname,{SONAME}");

    let Some(out_dir) = std::env::var_os("OUT_DIR") else {
        return;
    };
    let Some(profile_dir) = Path::new(&out_dir).ancestors().nth(3) else {
        return;
    };
    let link = profile_dir.join(SONAME);
    // An existing link (from an earlier build) already points at the right file.
    if std::fs::symlink_metadata(&link).is_ok() {
        return;
    }
    if let Err(e) = std::os::unix::fs::symlink(LIBRARY, &link) {
        println!("cargo::warning=could not create {}: {e}", link.display());
    }
}
