//! Feeding a host binary's code objects to the pack pipeline: the one place that turns a
//! visited [`CodeObject`] into what travels through the [pack pipeline](crate::tools::pack_pipeline) to its
//! archive, shared by
//! `pack --from-fatbin` and `split`.

use crate::host::fatbin::{CodeObject, HostFile, StreamError, visit_host_code_objects};
use crate::tools::pack_pipeline::Feed;

/// What a code object carries through the pipeline to its archive: its key, arch and bundler
/// triple (recorded as the entry's `target`), and the binary it came from (for the pins).
#[derive(Debug)]
pub struct Tag {
    pub key: String,
    pub arch: String,
    pub triple: String,
    pub kernel_name: String,
}

impl Tag {
    /// Splits a code object of the binary `kernel_name` into its tag and its bytes, as
    /// [`Feed::submit`] takes them.
    pub fn split(co: CodeObject, kernel_name: &str) -> (Tag, Vec<u8>) {
        let tag = Tag {
            key: co.key,
            arch: co.arch,
            triple: co.triple,
            kernel_name: kernel_name.to_owned(),
        };
        (tag, co.data)
    }
}

/// Submits every code object of `host`, in bundle order, tagged with `kernel_name`; returns
/// how many. `progress` receives section bytes as bundles are read. A submission error means
/// the pipeline stopped; it comes back as [`StreamError::Visit`].
pub fn submit_host_code_objects(
    kernel_name: &str,
    host: &HostFile,
    feed: &Feed<'_, Tag>,
    progress: &dyn Fn(u64),
) -> Result<usize, StreamError<crate::Error>> {
    let mut count = 0usize;
    visit_host_code_objects(
        kernel_name,
        host,
        |co| {
            count += 1;
            let (tag, data) = Tag::split(co, kernel_name);
            feed.submit(tag, data)
        },
        progress,
    )?;
    Ok(count)
}
