//! A front for a registry that sends blob GETs elsewhere, as registries backed by object
//! storage do: every `GET`/`HEAD` of `/v2/…/blobs/sha256:…` is answered `307` with a
//! `Location` on a second listener (the "storage host", another port, so another origin) with
//! a signature in its query; everything else is forwarded to `upstream` as sent, credentials
//! included. The storage listener serves the bytes by forwarding to the registry itself (with
//! its own credentials, when it is given some) and counts the requests that reached it with an
//! `Authorization` header: a client must never send its registry credentials there.
//!
//! One request per connection (`Connection: close`); std threads only.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::token_proxy::{Request, answer, read_request};

struct Shared {
    /// Where the front forwards what it does not redirect (the registry or a token front).
    upstream: u16,
    /// The registry itself, for the storage listener.
    registry: u16,
    /// The `Authorization` the storage listener sends the registry (its own access).
    storage_auth: Option<String>,
    storage_port: u16,
    redirected: AtomicU64,
    storage_requests: AtomicU64,
    storage_saw_authorization: AtomicU64,
    stop: AtomicBool,
}

pub struct RedirectFront {
    shared: Arc<Shared>,
    pub port: u16,
}

impl RedirectFront {
    /// A front on a free port forwarding to `upstream`, redirecting blobs to a storage
    /// listener that reads them from the registry on `registry` with `storage_auth`.
    pub fn start(upstream: u16, registry: u16, storage_auth: Option<String>) -> RedirectFront {
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let storage = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = front.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream,
            registry,
            storage_auth,
            storage_port: storage.local_addr().unwrap().port(),
            redirected: AtomicU64::new(0),
            storage_requests: AtomicU64::new(0),
            storage_saw_authorization: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        for (listener, is_storage) in [(front, false), (storage, true)] {
            let sh = shared.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if sh.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(mut conn) = conn else { continue };
                    let sh = sh.clone();
                    std::thread::spawn(move || {
                        if let Some(req) = read_request(&mut conn) {
                            if is_storage {
                                serve_storage(&sh, &mut conn, req);
                            } else {
                                serve_front(&sh, &mut conn, req);
                            }
                        }
                    });
                }
            });
        }
        RedirectFront { shared, port }
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Blob requests answered with a redirect.
    pub fn redirected(&self) -> u64 {
        self.shared.redirected.load(Ordering::SeqCst)
    }

    /// Requests the storage listener served.
    pub fn storage_requests(&self) -> u64 {
        self.shared.storage_requests.load(Ordering::SeqCst)
    }

    /// Requests that reached the storage listener with an `Authorization` header.
    pub fn storage_saw_authorization(&self) -> u64 {
        self.shared.storage_saw_authorization.load(Ordering::SeqCst)
    }
}

impl Drop for RedirectFront {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        let _ = TcpStream::connect(("127.0.0.1", self.shared.storage_port));
    }
}

fn serve_front(sh: &Shared, conn: &mut TcpStream, req: Request) {
    let blob = req.path.starts_with("/v2/") && req.path.contains("/blobs/sha256:");
    if blob && (req.method == "GET" || req.method == "HEAD") {
        sh.redirected.fetch_add(1, Ordering::SeqCst);
        let location = format!(
            "http://127.0.0.1:{}{}?X-Signature=s1gn3d",
            sh.storage_port, req.path
        );
        return answer(
            conn,
            "307 Temporary Redirect",
            &[("Location", location)],
            b"",
        );
    }
    forward(sh.upstream, conn, &req, None, true);
}

fn serve_storage(sh: &Shared, conn: &mut TcpStream, req: Request) {
    sh.storage_requests.fetch_add(1, Ordering::SeqCst);
    if req.header("authorization").is_some() {
        sh.storage_saw_authorization.fetch_add(1, Ordering::SeqCst);
    }
    let path = req.path.split('?').next().unwrap_or("").to_owned();
    if !path.contains("/blobs/sha256:") || !req.path.ends_with("?X-Signature=s1gn3d") {
        return answer(conn, "403 Forbidden", &[], b"not a signed blob URL");
    }
    let req = Request { path, ..req };
    forward(sh.registry, conn, &req, sh.storage_auth.as_deref(), false);
}

/// Sends `req` to `127.0.0.1:port` (its `Authorization` when `keep_auth`, else `auth`) and
/// relays the answer.
fn forward(port: u16, conn: &mut TcpStream, req: &Request, auth: Option<&str>, keep_auth: bool) {
    let Ok(mut up) = TcpStream::connect(("127.0.0.1", port)) else {
        return answer(conn, "502 Bad Gateway", &[], b"");
    };
    let mut out = format!("{} {} HTTP/1.1\r\n", req.method, req.path);
    for (k, v) in &req.headers {
        let is_auth = k.eq_ignore_ascii_case("authorization");
        if (keep_auth || !is_auth) && !k.eq_ignore_ascii_case("connection") {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    if let Some(a) = auth {
        out.push_str(&format!("Authorization: {a}\r\n"));
    }
    out.push_str("Connection: close\r\n\r\n");
    if up.write_all(out.as_bytes()).is_err() || up.write_all(&req.body).is_err() {
        return answer(conn, "502 Bad Gateway", &[], b"");
    }
    let mut reply = Vec::new();
    let _ = up.read_to_end(&mut reply);
    let _ = conn.write_all(&reply);
    let _ = conn.shutdown(Shutdown::Write);
}
