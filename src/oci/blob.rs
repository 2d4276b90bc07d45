//! One registry blob read by range, for [`RemoteObject`](crate::remote::object::RemoteObject):
//! the blob's digest is its version (a registry cannot change a blob's bytes under its
//! digest), and its identity in `--cache-dir` keys, so kernels kept from one mount are found by
//! a later mount of the same blob from any tag, repository or registry.

use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

use crate::remote::client::{FetchError, Fetched, Version};
use crate::remote::object::Ranges;

use super::reference::Digest;
use super::registry::Registry;

#[derive(Debug)]
pub struct BlobRanges {
    registry: Arc<Registry>,
    digest: Digest,
    /// The size the manifest's descriptor gives: the registry must agree.
    size: u64,
    /// Shown as the mount's times: when the tag was resolved.
    resolved: SystemTime,
}

impl BlobRanges {
    pub fn new(
        registry: Arc<Registry>,
        digest: &Digest,
        size: u64,
        resolved: SystemTime,
    ) -> BlobRanges {
        BlobRanges {
            registry,
            digest: digest.clone(),
            size,
            resolved,
        }
    }

    fn version(&self) -> Version {
        Version {
            etag: Some(self.digest.to_string()),
            last_modified: String::new(),
            modified: self.resolved,
            size: self.size,
        }
    }
}

impl Ranges for BlobRanges {
    fn get(
        &self,
        _what: &str,
        range: Range<u64>,
        // A blob's digest is its version: the registry cannot serve other bytes under it
        // without failing the frame and TOC checks.
        _expect: Option<&Version>,
        shrinkable: bool,
    ) -> Result<Fetched, FetchError> {
        let end = range.end.min(self.size);
        if range.start >= end {
            return Ok(Fetched {
                bytes: Vec::new(),
                version: self.version(),
                size: self.size,
            });
        }
        let (bytes, total) =
            self.registry
                .get_blob_range(&self.digest, range.start..end, shrinkable)?;
        if total != self.size {
            return Err(FetchError::Failed(format!(
                "{}: the registry says blob {} has {total} bytes; its manifest says {}",
                self.registry.name(),
                self.digest,
                self.size
            )));
        }
        Ok(Fetched {
            bytes,
            version: self.version(),
            size: self.size,
        })
    }

    fn identity(&self) -> Option<String> {
        Some(format!("oci-blob {}", self.digest))
    }

    fn costly_requests(&self) -> bool {
        true
    }
}
