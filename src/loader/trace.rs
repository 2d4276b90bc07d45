//! The loader's decisions as structured events, and where they go.
//!
//! One sequence of events feeds both the `ROCM_KPACK_DEBUG` log (each event renders to the
//! reference library's message, printed as `kpack: <message>`) and the `kpack-fuse resolve`
//! command (which shows or serialises the events). Events are only built when the sink is
//! enabled, so a silent load pays nothing for them.

use std::io::Write;

use serde::Serialize;

/// One step the loader took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    CacheCreated {
        disabled: bool,
        debug: bool,
        override_paths: usize,
        prefix_paths: usize,
    },
    Disabled,
    MetadataInvalid {
        reason: String,
    },
    MetadataParsed {
        kernel_name: String,
        co_index: u32,
        lookup_key: String,
        search_paths: usize,
    },
    UsingOverride {
        paths: usize,
    },
    PrependingPrefix {
        paths: usize,
    },
    /// A `@GFXARCH@` pattern (already resolved against the binary's directory) and one of its
    /// expansions.
    ExpandedPattern {
        pattern: String,
        path: String,
    },
    /// A target of the caller's arch list that is not one plain file-name component (`/`, `.`,
    /// `..`, NUL): not substituted into the pattern, so no search path leaves its directory.
    UnsafeTarget {
        pattern: String,
        target: String,
    },
    /// An embedded path without `@GFXARCH@`, and where it resolved to.
    DirectPath {
        original: String,
        resolved: String,
    },
    /// A search path that is not a regular file, and why (`no such file`, `not a regular file`).
    ArchiveMissing {
        path: String,
        reason: String,
    },
    /// A search path that exists but did not open as an archive (skipped, retried next call).
    ArchiveOpenFailed {
        path: String,
        code: i32,
        reason: String,
    },
    ArchiveOpened {
        path: String,
        architectures: Vec<String>,
    },
    /// A search path whose canonical file this cache already holds.
    ArchiveReused {
        path: String,
    },
    /// The binary has pins and this archive's TOC digest is one of them.
    PinMatched {
        path: String,
        toc_blake3: String,
    },
    /// The binary has pins and this archive's TOC digest is not one of them: skipped like an
    /// archive that does not open (the search goes on).
    ArchiveNotPinned {
        path: String,
        toc_blake3: String,
    },
    NoValidArchives {
        paths: usize,
    },
    TryingArchitecture {
        arch: String,
    },
    /// An archive whose `gfx_arches` lists `target`; the kernel is looked up there next.
    Candidate {
        archive: String,
        target: String,
    },
    KernelFound {
        size: u64,
    },
    KernelMissing {
        code: i32,
        reason: String,
    },
    NotInAnyArchive {
        last_error: i32,
    },
    NoCompatibleArchive,
    Loaded {
        size: usize,
        archive: String,
        target: String,
    },
}

impl Event {
    /// The debug-log lines of this event, worded as the reference library words them (without
    /// the `kpack: ` prefix). Events the reference does not log give no lines.
    pub fn log_lines(&self) -> Vec<String> {
        match self {
            Event::CacheCreated {
                disabled,
                debug,
                override_paths,
                prefix_paths,
            } => vec![format!(
                "cache created: disabled={}, debug={}, override_paths={override_paths}, prefix_paths={prefix_paths}",
                u8::from(*disabled),
                u8::from(*debug)
            )],
            Event::Disabled => vec!["kpack disabled via ROCM_KPACK_DISABLE".into()],
            Event::MetadataInvalid { .. } => vec!["failed to parse HIPK metadata".into()],
            Event::MetadataParsed {
                kernel_name,
                co_index,
                lookup_key,
                search_paths,
            } => vec![format!(
                "parsed HIPK metadata: kernel_name='{kernel_name}', co_index={co_index}, lookup_key='{lookup_key}', {search_paths} search paths"
            )],
            Event::UsingOverride { paths } => {
                vec![format!("using ROCM_KPACK_PATH override: {paths} paths")]
            }
            Event::PrependingPrefix { paths } => {
                vec![format!(
                    "prepending {paths} paths from ROCM_KPACK_PATH_PREFIX"
                )]
            }
            Event::ExpandedPattern { pattern, path } => {
                vec![format!("expanded pattern: {pattern} -> {path}")]
            }
            Event::UnsafeTarget { pattern, target } => {
                vec![format!(
                    "not expanding pattern: {pattern} with unsafe arch {target:?}"
                )]
            }
            Event::DirectPath { original, resolved } => {
                vec![format!("direct path: {original} -> {resolved}")]
            }
            Event::ArchiveMissing { path, .. } => vec![format!("archive not found: {path}")],
            Event::ArchiveOpenFailed { path, code, .. } => {
                vec![format!("failed to open archive: {path} (error {code})")]
            }
            Event::ArchiveOpened {
                path,
                architectures,
            } => {
                let mut lines = vec![format!("opened and cached archive: {path}")];
                lines.extend(architectures.iter().map(|a| format!("  architecture: {a}")));
                lines
            }
            Event::ArchiveReused { .. } => Vec::new(),
            Event::PinMatched { path, .. } => vec![format!("archive matches a pin: {path}")],
            Event::ArchiveNotPinned { path, toc_blake3 } => vec![format!(
                "archive not pinned by the binary, skipped: {path} (toc blake3 {toc_blake3})"
            )],
            Event::NoValidArchives { paths } => {
                vec![format!("no valid archives found in {paths} kpack paths")]
            }
            Event::TryingArchitecture { arch } => vec![format!("trying architecture: {arch}")],
            Event::Candidate { archive, target } => {
                vec![format!("  archive {archive} has architecture {target}")]
            }
            Event::KernelFound { size } => vec![format!("  found kernel: {size} bytes")],
            Event::KernelMissing { code, .. } => vec![format!(
                "  kernel not found in this archive (error {code}), trying next candidate"
            )],
            Event::NotInAnyArchive { last_error } => vec![format!(
                "kernel not found in any compatible archive (last error {last_error})"
            )],
            Event::NoCompatibleArchive => {
                vec!["no archive with compatible architecture found".into()]
            }
            Event::Loaded { size, .. } => vec![format!("loaded code object: {size} bytes")],
        }
    }
}

/// Where events go.
pub trait Trace {
    /// Whether events are wanted at all; when false they are never built.
    fn enabled(&self) -> bool;
    fn record(&mut self, event: Event);
}

/// Builds and records an event only when the sink wants it.
pub fn emit(trace: &mut dyn Trace, event: impl FnOnce() -> Event) {
    if trace.enabled() {
        trace.record(event());
    }
}

/// Discards everything.
pub struct Silent;

impl Trace for Silent {
    fn enabled(&self) -> bool {
        false
    }
    fn record(&mut self, _event: Event) {}
}

/// The `ROCM_KPACK_DEBUG` log: each line to standard error as `kpack: <message>`.
pub struct StderrLog;

impl Trace for StderrLog {
    fn enabled(&self) -> bool {
        true
    }
    fn record(&mut self, event: Event) {
        let mut err = std::io::stderr().lock();
        for line in event.log_lines() {
            // A closed or full stderr must not fail (or panic) a load.
            let _ = writeln!(err, "kpack: {line}");
        }
    }
}

/// Keeps every event, for callers that show them afterwards.
#[derive(Debug, Default)]
pub struct Recorder {
    pub events: Vec<Event>,
}

impl Trace for Recorder {
    fn enabled(&self) -> bool {
        true
    }
    fn record(&mut self, event: Event) {
        self.events.push(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_match_the_reference_wording() {
        let e = Event::CacheCreated {
            disabled: false,
            debug: true,
            override_paths: 2,
            prefix_paths: 0,
        };
        assert_eq!(
            e.log_lines(),
            ["cache created: disabled=0, debug=1, override_paths=2, prefix_paths=0"]
        );
        let e = Event::MetadataParsed {
            kernel_name: "lib/a.so".into(),
            co_index: 3,
            lookup_key: "lib/a.so#3".into(),
            search_paths: 1,
        };
        assert_eq!(
            e.log_lines(),
            [
                "parsed HIPK metadata: kernel_name='lib/a.so', co_index=3, lookup_key='lib/a.so#3', 1 search paths"
            ]
        );
        let e = Event::ArchiveOpened {
            path: "/a.kpack".into(),
            architectures: vec!["gfx900".into()],
        };
        assert_eq!(
            e.log_lines(),
            [
                "opened and cached archive: /a.kpack",
                "  architecture: gfx900"
            ]
        );
        assert_eq!(
            Event::NotInAnyArchive { last_error: 5 }.log_lines(),
            ["kernel not found in any compatible archive (last error 5)"]
        );
        assert!(
            Event::ArchiveReused { path: "/a".into() }
                .log_lines()
                .is_empty()
        );
    }

    #[test]
    fn silent_sink_never_builds_events() {
        let mut built = false;
        emit(&mut Silent, || {
            built = true;
            Event::Disabled
        });
        assert!(!built);
        let mut r = Recorder::default();
        emit(&mut r, || Event::Disabled);
        assert_eq!(r.events, [Event::Disabled]);
    }
}
