//! The C boundary read from the sources: every function `src/ffi/` exports runs all of its body
//! inside the panic guard (`ffi/guard.rs`: `guard`, or `guard_void` for a function without a
//! result), so no panic unwinds into C; and the functions exported in the sources are exactly
//! those the headers declare and the built `.so` exports. Nothing outside `src/ffi/` exports.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::abi::{header_functions, shared_library_exports};
use crate::layers::rust_files;

/// The guard functions of `src/ffi/guard.rs`: an exported function's body is one call of one.
const GUARDS: [&str; 2] = ["guard", "guard_void"];

/// The attributes that export a Rust item under its own or a given name.
const EXPORTING: [&str; 2] = ["no_mangle", "export_name"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Rust source as code: comments blanked out (same byte positions), and per byte whether it
/// is code rather than the inside of a string or character literal.
struct Code {
    text: Vec<u8>,
    plain: Vec<bool>,
}

impl Code {
    fn new(source: &str) -> Code {
        let b = source.as_bytes();
        let mut text = b.to_vec();
        let mut plain = vec![true; b.len()];
        let mut i = 0;
        while i < b.len() {
            if b[i..].starts_with(b"//") {
                let end = b[i..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |n| i + n);
                text[i..end].fill(b' ');
                plain[i..end].fill(false);
                i = end;
            } else if b[i..].starts_with(b"/*") {
                let (mut depth, mut j) = (1, i + 2);
                while depth > 0 && j < b.len() {
                    if b[j..].starts_with(b"/*") {
                        (depth, j) = (depth + 1, j + 2);
                    } else if b[j..].starts_with(b"*/") {
                        (depth, j) = (depth - 1, j + 2);
                    } else {
                        j += 1;
                    }
                }
                for c in &mut text[i..j] {
                    if *c != b'\n' {
                        *c = b' ';
                    }
                }
                plain[i..j].fill(false);
                i = j;
            } else if let Some(hashes) = raw_string_hashes(b, i) {
                let close = [&b"\""[..], &vec![b'#'; hashes]].concat();
                let body = i + 2 + hashes;
                let end = body
                    + b[body..]
                        .windows(close.len())
                        .position(|w| w == close.as_slice())
                        .expect("raw string is closed")
                    + close.len();
                plain[i + 1..end].fill(false);
                i = end;
            } else if b[i] == b'"' {
                let mut j = i + 1;
                while b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                plain[i..=j].fill(false);
                i = j + 1;
            } else if b[i] == b'\'' {
                // A character literal ('x', '\n', '→'), or else a lifetime or label.
                let len = if b.get(i + 1) == Some(&b'\\') {
                    b[i + 2..].iter().position(|&c| c == b'\'').map(|n| n + 3)
                } else {
                    source[i + 1..]
                        .chars()
                        .next()
                        .map(char::len_utf8)
                        .filter(|&n| b.get(i + 1 + n) == Some(&b'\''))
                        .map(|n| n + 2)
                };
                let len = len.unwrap_or(1);
                if len > 1 {
                    plain[i..i + len].fill(false);
                }
                i += len;
            } else {
                i += 1;
            }
        }
        Code { text, plain }
    }

    /// Where `needle` next stands in code (not in a string), from `from`.
    fn find(&self, needle: &str, from: usize) -> Option<usize> {
        let n = needle.as_bytes();
        (from..=self.text.len().saturating_sub(n.len()))
            .find(|&i| self.plain[i] && self.text[i..].starts_with(n))
    }

    /// The position of the bracket closing the one at `open`.
    fn matching(&self, open: usize) -> usize {
        let (up, down) = match self.text[open] {
            b'(' => (b'(', b')'),
            b'{' => (b'{', b'}'),
            other => panic!("not an opening bracket: {:?}", other as char),
        };
        let mut depth = 0;
        for i in open..self.text.len() {
            if !self.plain[i] {
                continue;
            }
            if self.text[i] == up {
                depth += 1;
            } else if self.text[i] == down {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
        }
        panic!("bracket at byte {open} is not closed")
    }

    fn str(&self, from: usize, to: usize) -> &str {
        std::str::from_utf8(&self.text[from..to]).unwrap()
    }
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// At the start of a raw string (`r"…"`, `r#"…"#`, `br"…"`), the number of its `#`s.
fn raw_string_hashes(b: &[u8], i: usize) -> Option<usize> {
    let prefix_ends = |j: usize| j == 0 || !is_ident(b[j - 1]);
    let starts = b[i] == b'r' && (prefix_ends(i) || (b[i - 1] == b'b' && prefix_ends(i - 1)));
    if !starts {
        return None;
    }
    let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
    (b.get(i + 1 + hashes) == Some(&b'"')).then_some(hashes)
}

/// A function with an exporting attribute: its name, whether it is `extern "C"`, its body.
struct Export {
    name: String,
    extern_c: bool,
    body: String,
}

/// The exporting attributes of a source file, each with the function it is on (or `Err` with
/// what it is on when that is not a function).
fn exports(source: &str) -> Vec<Result<Export, String>> {
    let code = Code::new(source);
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(attr) = EXPORTING
        .iter()
        .filter_map(|a| code.find(a, at))
        .filter(|&i| code.text[..i].ends_with(b"#[") || code.text[..i].ends_with(b"#[unsafe("))
        .min()
    {
        at = attr + 1;
        // The item the attribute is on: the next `fn`, unless an item ends (`;`) before it.
        let fn_at = code.find("fn ", attr);
        let item_end = code.find(";", attr);
        let Some(fn_at) = fn_at.filter(|&f| item_end.is_none_or(|e| f < e)) else {
            let item = code.find("]", attr).map_or(attr, |i| i + 1);
            let end = item_end.unwrap_or(code.text.len());
            let words: Vec<&str> = code.str(item, end).split_whitespace().collect();
            out.push(Err(words.join(" ")));
            continue;
        };
        let head = code.str(attr, fn_at);
        let name_start = fn_at + 3;
        let open = code.find("(", name_start).expect("parameter list");
        let name = code.str(name_start, open).trim();
        let name = name
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .next()
            .unwrap()
            .to_owned();
        let body_open = code.find("{", code.matching(open)).expect("body");
        let body_close = code.matching(body_open);
        out.push(Ok(Export {
            name,
            extern_c: head.contains("extern \"C\" "),
            body: code.str(body_open + 1, body_close).to_owned(),
        }));
    }
    out
}

/// Whether `body` is one call of a guard and nothing else, so that all of it runs inside.
fn is_one_guard_call(body: &str) -> bool {
    let body = body.trim();
    let body = body.strip_suffix(';').unwrap_or(body).trim_end();
    GUARDS.iter().any(|g| {
        body.strip_prefix(g)
            .and_then(|rest| rest.strip_prefix('('))
            .is_some_and(|_| {
                let code = Code::new(body);
                code.matching(g.len()) == body.len() - 1
            })
    })
}

/// Every exporting attribute in `src/`, with the file it is in.
fn exports_below_src() -> Vec<(PathBuf, Result<Export, String>)> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.sort();
    files
        .into_iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            exports(&text).into_iter().map(move |e| (f.clone(), e))
        })
        .collect()
}

#[test]
fn every_export_runs_inside_the_panic_guard() {
    let ffi = src().join("ffi");
    let mut wrong = Vec::new();
    let mut names = BTreeSet::new();
    for (file, export) in exports_below_src() {
        let rel = file.strip_prefix(src()).unwrap().display().to_string();
        match export {
            Err(item) => wrong.push(format!("{rel}: exports something not a function: {item}")),
            Ok(e) => {
                if !file.starts_with(&ffi) {
                    wrong.push(format!("{rel}: {} is exported outside src/ffi/", e.name));
                }
                if !e.extern_c {
                    wrong.push(format!(
                        "{rel}: {} is exported but not extern \"C\"",
                        e.name
                    ));
                }
                if !is_one_guard_call(&e.body) {
                    wrong.push(format!(
                        "{rel}: the body of {} is not one call of {}",
                        e.name,
                        GUARDS.join(" or ")
                    ));
                }
                assert!(names.insert(e.name.clone()), "{} twice", e.name);
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert_eq!(
        names,
        header_functions(),
        "exported in src/ffi/ vs declared"
    );
    assert_eq!(
        names,
        shared_library_exports(),
        "exported in src/ffi/ vs the .so"
    );
}

/// The guards are what the test above takes them for: each runs its body in `catch_unwind`.
#[test]
fn the_guards_catch_panics() {
    let text = std::fs::read_to_string(src().join("ffi/guard.rs")).unwrap();
    let code = Code::new(&text);
    for g in GUARDS {
        let at = code
            .find(&format!("fn {g}("), 0)
            .unwrap_or_else(|| panic!("ffi/guard.rs has no fn {g}"));
        let open = code.find("{", code.matching(at + 3 + g.len())).unwrap();
        let body = code.str(open + 1, code.matching(open));
        assert!(
            body.trim_start().starts_with("catch_unwind(")
                || body.trim_start().starts_with("let _ = catch_unwind(")
                || body.trim_start().starts_with("match catch_unwind("),
            "fn {g} does not start with catch_unwind: {body}"
        );
    }
}

/// The reader of the test above finds what it must: guarded and unguarded bodies, comments and
/// strings that mention the attribute, and attributes on other items.
#[test]
fn the_export_reader_tells_guarded_from_unguarded() {
    let source = r##"
        // #[unsafe(no_mangle)] in a comment
        const S: &str = "#[no_mangle] pub extern \"C\" fn fake() {}";
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn good(p: *const u8) -> kpack_error_t {
            // SAFETY: a comment with a } brace
            guard(|| { let c = '}'; let s = "}{"; Ok(()) })
        }
        #[unsafe(no_mangle)]
        pub extern "C" fn void_good() {
            guard_void(|| {});
        }
        #[no_mangle]
        pub extern "C" fn bad() -> i32 {
            let x = 1;
            guard(|| Ok(()))
        }
        #[unsafe(no_mangle)]
        pub extern "C" fn bad_after<'a>(x: &'a u8) -> i32 {
            guard(|| Ok(())) + 1
        }
        #[unsafe(export_name = "renamed")]
        pub fn not_c() {
            guard_void(|| {})
        }
        #[unsafe(no_mangle)]
        pub static DATA: u32 = 0;
    "##;
    let got: Vec<_> = exports(source)
        .into_iter()
        .map(|e| match e {
            Ok(e) => format!("{} {} {}", e.name, e.extern_c, is_one_guard_call(&e.body)),
            Err(item) => format!("not a function: {item}"),
        })
        .collect();
    assert_eq!(
        got,
        [
            "good true true",
            "void_good true true",
            "bad true false",
            "bad_after true false",
            "not_c false true",
            "not a function: pub static DATA: u32 = 0",
        ]
    );
}
