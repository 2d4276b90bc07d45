//! `kpack-fuse push SOURCE... oci://REGISTRY[:PORT]/REPOSITORY[:TAG]`: archives into a
//! container registry as one kernel-pack artifact (src/oci/push.rs does the work; docs/oci.md
//! describes the artifact).

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::exit::{CliError, CliResult, Exit};
use crate::cli::out::{errln, outln};
use crate::oci::push;
use crate::remote::settings::Settings;

const AFTER: &str = "\
The artifact has artifactType application/vnd.kpack-fuse.pack.v1, the empty config, and one
layer per archive (its bytes unchanged, titled by its file name), followed by a kernel index
layer for archives whose frames are not positioned in their TOC (docs/oci.md). Blobs the
registry already has are not sent again; the same archives give the same manifest digest.

Credentials: REGISTRY_AUTH_FILE, else ${XDG_RUNTIME_DIR}/containers/auth.json, then
~/.docker/config.json (auths, credHelpers, credsStore), as podman reads them.

Output: the manifest digest, then REGISTRY/REPOSITORY@DIGEST; with --json one object.

Exit codes: 0 pushed; 2 bad reference or arguments (a digest instead of a tag, two sources
with the same file name); 3 a source cannot be read, or the registry refused or could not be
reached (the message names the registry's error code, e.g. UNAUTHORIZED, DENIED,
NAME_UNKNOWN, and the HTTP status); 4 a source is not a valid archive; 5 a directory holds no
*.kpack file.";

#[derive(Debug, clap::Args)]
#[command(after_long_help = AFTER)]
pub struct Args {
    /// Archives, or directories whose *.kpack files (directly inside, in name order) are pushed,
    /// then the destination oci://REGISTRY[:PORT]/REPOSITORY[:TAG] (TAG defaults to latest).
    #[arg(required = true, num_args = 2.., value_name = "SOURCE... DEST")]
    pub operands: Vec<PathBuf>,
    /// Print one JSON object: reference, digest, layers, and which blobs were uploaded or
    /// already present.
    #[arg(long)]
    pub json: bool,
    /// With false, accept any TLS certificate and fall back to plain HTTP when HTTPS fails
    /// (plain HTTP is otherwise used only for loopback registries).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub tls_verify: bool,
    /// Seconds one registry request may take before it is retried [default: 30].
    #[arg(long, value_name = "SECS", value_parser = super::remote_args::parse_secs)]
    pub remote_timeout: Option<u64>,
    /// Seconds to establish a connection before the attempt is retried [default: 5].
    #[arg(long, value_name = "SECS", value_parser = super::remote_args::parse_secs)]
    pub remote_connect_timeout: Option<u64>,
    /// Retries of a registry request (an upload: from its start) after a timeout, connection
    /// error, 5xx or 429, with exponential backoff or the server's Retry-After [default: 3].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=20))]
    pub remote_retries: Option<u32>,
}

impl Args {
    fn settings(&self) -> Settings {
        let d = Settings::default();
        Settings {
            endpoint_url: None,
            timeout: self.remote_timeout.map_or(d.timeout, Duration::from_secs),
            connect_timeout: self
                .remote_connect_timeout
                .map_or(d.connect_timeout, Duration::from_secs),
            retries: self.remote_retries.unwrap_or(d.retries),
            requests: d.requests,
            tls_verify: self.tls_verify,
        }
    }
}

pub fn run(args: Args) -> CliResult {
    let (sources, dest) = args.operands.split_at(args.operands.len() - 1);
    let dest = dest[0].to_str().ok_or_else(|| {
        CliError::new(
            Exit::Usage,
            format!("{}: not an oci:// reference", dest[0].display()),
        )
    })?;
    let (reference, tag) = push::target(dest)?;
    if !args.tls_verify {
        errln!(
            "kpack-fuse: warning: --tls-verify=false: certificates are not checked and plain HTTP may be used"
        );
    }
    let files = push::archive_files(sources)?;
    let prepared = push::prepare(&files)?;
    let bar = std::cell::RefCell::new(None::<indicatif::ProgressBar>);
    let pushed = push::push(
        &reference,
        &tag,
        &prepared,
        args.tls_verify,
        &args.settings(),
        &|done, total| {
            let mut b = bar.borrow_mut();
            if b.is_none() {
                *b = super::progress::bar(total);
            }
            if let Some(b) = &*b {
                b.set_position(done);
            }
        },
    )?;
    if let Some(b) = bar.into_inner() {
        b.finish_and_clear();
    }
    let pinned = reference.pinned(&pushed.digest);
    if args.json {
        let layers: Vec<serde_json::Value> = pushed
            .manifest
            .layers
            .iter()
            .map(|l| {
                serde_json::json!({
                    "title": l.annotations.get(crate::oci::manifest::ANN_TITLE),
                    "digest": l.digest,
                    "size": l.size,
                    "mediaType": l.media_type,
                })
            })
            .collect();
        let v = serde_json::json!({
            "reference": reference.to_string(),
            "digest": pushed.digest.to_string(),
            "pinned": pinned,
            "layers": layers,
            "uploaded": pushed.uploaded.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "present": pushed.present.iter().map(ToString::to_string).collect::<Vec<_>>(),
        });
        outln!("{v}")?;
    } else {
        outln!("{}", pushed.digest)?;
        outln!("{pinned}")?;
    }
    Ok(())
}
