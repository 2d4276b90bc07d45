//! Writing to a registry: blob uploads (monolithic, POST then PUT with the digest, for small
//! blobs; chunked, POST then one PATCH per chunk following each `Location`, then PUT, for large
//! ones) and manifest PUTs by tag. An upload that fails in a retryable way is started over
//! from a new session (a PATCH cannot safely be resent), under the same retry policy as
//! every request.

use std::os::unix::fs::FileExt;
use std::path::Path;

use bytes::Bytes;
use reqwest::header;
use reqwest::{Method, Url};

use super::reference::Digest;
use super::registry::{Live, Registry, Req, status_failure};
use crate::remote::client::FetchError;
use crate::remote::retry::{Class, Failure};

/// Blobs up to this size go up in one PUT.
pub const MONOLITHIC_MAX: u64 = 8 << 20;
/// The size of each PATCH of a chunked upload.
pub const CHUNK: u64 = 16 << 20;

/// What an upload reads from.
#[derive(Debug, Clone, Copy)]
pub enum BlobData<'a> {
    Bytes(&'a [u8]),
    File(&'a Path),
}

/// How blobs are split: see [`MONOLITHIC_MAX`] and [`CHUNK`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunking {
    pub monolithic_max: u64,
    pub chunk: u64,
}

impl Default for Chunking {
    fn default() -> Chunking {
        Chunking {
            monolithic_max: MONOLITHIC_MAX,
            chunk: CHUNK,
        }
    }
}

impl BlobData<'_> {
    fn read(&self, offset: u64, len: u64) -> Result<Bytes, Failure> {
        match self {
            BlobData::Bytes(b) => Ok(Bytes::copy_from_slice(
                &b[offset as usize..(offset + len) as usize],
            )),
            BlobData::File(p) => {
                let f = std::fs::File::open(p).map_err(|e| {
                    Failure::new(Class::Fatal, rocm_kpack::error::io_message(p, &e))
                })?;
                let mut buf = vec![0u8; len as usize];
                f.read_exact_at(&mut buf, offset).map_err(|e| {
                    Failure::new(Class::Fatal, rocm_kpack::error::io_message(p, &e))
                })?;
                Ok(Bytes::from(buf))
            }
        }
    }
}

impl Registry {
    /// Uploads a blob of `size` bytes whose digest is `digest`, in one PUT up to
    /// `chunking.monolithic_max`, else in PATCHes of `chunking.chunk` bytes; `progress` is told
    /// the bytes of this blob sent so far after each request.
    pub fn upload_blob(
        &self,
        digest: &Digest,
        size: u64,
        data: BlobData<'_>,
        chunking: Chunking,
        progress: &dyn Fn(u64),
    ) -> Result<(), FetchError> {
        let live = self.live()?;
        let what = format!("uploading blob {}@{digest}", self.name());
        self.with_retries(&what, false, || {
            live.rt.block_on(async {
                progress(0);
                let mut at = self.start_upload(&live).await?;
                if size <= chunking.monolithic_max {
                    let body = data.read(0, size)?;
                    return self
                        .finish_upload(&live, at, digest, Some(body))
                        .await
                        .map(|()| {
                            progress(size);
                        });
                }
                let chunk = chunking.chunk.max(1);
                let mut done = 0u64;
                while done < size {
                    let n = chunk.min(size - done);
                    let body = data.read(done, n)?;
                    let req = Req::new(Method::PATCH, at.clone())
                        .header(header::CONTENT_TYPE, "application/octet-stream")
                        .header(header::CONTENT_RANGE, &format!("{}-{}", done, done + n - 1))
                        .header(header::CONTENT_LENGTH, &n.to_string());
                    let req = Req {
                        body: Some(body),
                        ..req
                    };
                    let r = self.send(&live, &req).await?;
                    if r.status().as_u16() != 202 {
                        return Err(status_failure(r).await);
                    }
                    at = location(&at, &r)?;
                    done += n;
                    progress(done);
                }
                self.finish_upload(&live, at, digest, None).await
            })
        })
    }

    /// `POST /v2/NAME/blobs/uploads/`: the upload's URL.
    async fn start_upload(&self, live: &Live) -> Result<Url, Failure> {
        let url = self.url(live, "blobs/uploads/");
        let req = Req::new(Method::POST, url.clone()).header(header::CONTENT_LENGTH, "0");
        let r = self.send(live, &req).await?;
        if r.status().as_u16() != 202 {
            return Err(status_failure(r).await);
        }
        location(&url, &r)
    }

    /// The closing `PUT ?digest=`, with the whole blob or nothing (after PATCHes).
    async fn finish_upload(
        &self,
        live: &Live,
        mut at: Url,
        digest: &Digest,
        body: Option<Bytes>,
    ) -> Result<(), Failure> {
        at.query_pairs_mut().append_pair("digest", digest.as_str());
        let len = body.as_ref().map_or(0, Bytes::len);
        let mut req = Req::new(Method::PUT, at)
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .header(header::CONTENT_LENGTH, &len.to_string());
        req.body = Some(body.unwrap_or_default());
        let r = self.send(live, &req).await?;
        if r.status().as_u16() != 201 {
            return Err(status_failure(r).await);
        }
        Ok(())
    }

    /// Puts `bytes` (of media type `media_type`) as the manifest of `tag`: the digest the
    /// registry gives it, which must be the digest of `bytes`.
    pub fn put_manifest(
        &self,
        tag: &str,
        media_type: &str,
        bytes: &[u8],
    ) -> Result<Digest, FetchError> {
        let live = self.live()?;
        let what = format!("manifest {}:{tag}", self.name());
        let ours = Digest::of(bytes);
        let mut req = Req::new(Method::PUT, self.url(&live, &format!("manifests/{tag}")))
            .header(header::CONTENT_TYPE, media_type);
        req.body = Some(Bytes::copy_from_slice(bytes));
        let sent = self.with_retries(&what, false, || {
            live.rt.block_on(async {
                let r = self.send(&live, &req).await?;
                if r.status().as_u16() != 201 {
                    return Err(status_failure(r).await);
                }
                Ok(r.headers()
                    .get("docker-content-digest")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned))
            })
        })?;
        match sent {
            Some(s) if s != ours.as_str() => Err(FetchError::Failed(format!(
                "{what}: the registry stored it as {s}, but its digest is {ours}"
            ))),
            _ => Ok(ours),
        }
    }
}

/// The `Location` of an upload answer, resolved against the request's URL.
fn location(base: &Url, r: &reqwest::Response) -> Result<Url, Failure> {
    let loc = r
        .headers()
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            Failure::new(
                Class::Fatal,
                format!("HTTP {} without a Location for the upload", r.status()),
            )
        })?;
    base.join(loc).map_err(|e| {
        Failure::new(
            Class::Fatal,
            format!("the upload's Location {loc:?} is not usable: {e}"),
        )
    })
}
