//! The C library links no HTTP or TLS code: remote sources live only in the `kpack-fuse`
//! program. Checked on the built `librocm_kpack.so` (its dynamic dependencies and every symbol
//! in its symbol table) and `librocm_kpack.a` (its symbols).

use std::path::Path;
use std::process::Command;

use crate::support::cc;

/// Crates of the network stack; none may appear in a symbol of the library.
const NETWORK_CRATES: [&str; 8] = [
    "object_store",
    "reqwest",
    "hyper",
    "rustls",
    "tokio",
    "h2",
    "ring_core",
    "quick_xml",
];

fn symbols(args: &[&str], lib: &Path) -> String {
    let out = Command::new("nm").args(args).arg(lib).output().unwrap();
    assert!(
        out.status.success(),
        "nm {}: {}",
        lib.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether a demangled symbol name has a path component `name::` (not a longer word ending in
/// `name`), or, for ring's C code, starts with its prefix.
fn mentions(symbol: &str, name: &str) -> bool {
    if name == "ring_core" {
        return symbol.starts_with("ring_core_");
    }
    let pat = format!("{name}::");
    symbol.match_indices(&pat).any(|(at, _)| {
        symbol[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
    })
}

/// The symbol names of `nm -C` output (`[address] TYPE NAME` lines; file headers skipped).
fn symbol_names(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ' ');
            let (a, b, c) = (f.next()?, f.next()?, f.next());
            match c {
                Some(name) if b.len() == 1 => Some(name),
                None if a.len() == 1 => Some(b),
                _ => None,
            }
        })
        .collect()
}

fn assert_no_network_symbols(text: &str, what: &str) {
    for symbol in symbol_names(text) {
        for name in NETWORK_CRATES {
            assert!(
                !mentions(symbol, name),
                "{what} has a {name} symbol: {symbol}"
            );
        }
    }
}

#[test]
fn the_c_library_links_no_http_or_tls_code() {
    let so = cc::built_library();
    let out = Command::new("readelf").arg("-d").arg(&so).output().unwrap();
    let dynamic = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<&str> = dynamic
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next())
        .collect();
    assert!(!needed.is_empty(), "{dynamic}");
    for lib in &needed {
        assert!(
            [
                "libc.so",
                "libm.so",
                "libgcc_s.so",
                "libpthread.so",
                "libdl.so",
                "ld-linux",
                "librt.so"
            ]
            .iter()
            .any(|ok| lib.starts_with(ok)),
            "librocm_kpack.so needs {lib} (all: {needed:?})"
        );
    }
    assert_no_network_symbols(&symbols(&["-C"], &so), "librocm_kpack.so");
    let a = so.with_file_name("librocm_kpack.a");
    let a = if a.exists() {
        a
    } else {
        so.parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("librocm_kpack.a")
    };
    assert_no_network_symbols(&symbols(&["-C", "--defined-only"], &a), "librocm_kpack.a");
}

#[test]
fn the_program_does_link_the_network_code() {
    // The check above means something only if the names it looks for are those the program's
    // network code really has.
    let exe = Path::new(env!("CARGO_BIN_EXE_kpack-fuse"));
    let text = symbols(&["-C"], exe);
    let names = symbol_names(&text);
    for name in NETWORK_CRATES {
        assert!(
            names.iter().any(|s| mentions(s, name)),
            "kpack-fuse has no {name} symbol"
        );
    }
}
