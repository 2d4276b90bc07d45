//! `kpack-fuse man DIR` (hidden): writes the manual pages, generated from this very command-line
//! definition with `clap_mangen`, so they can never disagree with `--help`. `scripts/install.sh`
//! runs it and installs the pages under `share/man/man1`. A subcommand rather than a build
//! step: the pages come from the binary that gets installed, and building needs no extra tool.

use std::path::{Path, PathBuf};

use clap::CommandFactory;

use super::{CliError, CliResult, Exit};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory to write kpack-fuse.1 and kpack-fuse-COMMAND.1 into (created if missing).
    pub dir: PathBuf,
}

/// The pages, as (file name, roff text): one for the program, one per visible subcommand.
pub fn pages() -> Vec<(String, Vec<u8>)> {
    let top = super::Cli::command();
    let version = env!("CARGO_PKG_VERSION");
    let mut out = vec![("kpack-fuse.1".to_owned(), render(top.clone()))];
    for sub in top.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("kpack-fuse-{}", sub.get_name());
        let cmd = sub
            .clone()
            .display_name(name.clone())
            .bin_name(format!("kpack-fuse {}", sub.get_name()))
            .version(version);
        out.push((format!("{name}.1"), render(cmd)));
    }
    out
}

fn render(cmd: clap::Command) -> Vec<u8> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut buf)
        .expect("rendering into memory cannot fail");
    buf
}

pub fn run(args: Args) -> CliResult {
    write_pages(&args.dir)
}

fn write_pages(dir: &Path) -> CliResult {
    let fail = |what: &Path, e: std::io::Error| CliError::io(Exit::Output, &what, &e);
    std::fs::create_dir_all(dir).map_err(|e| fail(dir, e))?;
    for (name, text) in pages() {
        let path = dir.join(&name);
        std::fs::write(&path, text).map_err(|e| fail(&path, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_page_per_visible_command() {
        let names: Vec<String> = super::pages().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names[0], "kpack-fuse.1");
        for must in [
            "kpack-fuse-mount.1",
            "kpack-fuse-unmount.1",
            "kpack-fuse-list.1",
        ] {
            assert!(names.iter().any(|n| n == must), "{names:?}");
        }
        assert!(!names.iter().any(|n| n == "kpack-fuse-man.1"), "{names:?}");
        let (_, mount) = super::pages()
            .into_iter()
            .find(|(n, _)| n == "kpack-fuse-mount.1")
            .unwrap();
        let text = String::from_utf8(mount).unwrap();
        assert!(text.contains("\n.TH kpack-fuse-mount 1 "), "{text}");
        assert!(text.contains("\n\\fBkpack\\-fuse mount\\fR "), "{text}");
        assert!(text.contains("\\-\\-cache\\-size"), "{text}");
    }
}
