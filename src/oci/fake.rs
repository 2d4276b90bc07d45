//! A tiny HTTP/1.1 server on 127.0.0.1 for the client's unit tests (redirects across origins,
//! ranges, refusals): each connection carries one request, answered by a closure, and every
//! request is recorded with its headers. The push tests against a real registry are in
//! tests/it/oci/.
//!
//! An answer's body is sent with a true `Content-Length` unless the answer has the pseudo-header
//! [`FRAMING`] (not sent), which says how it goes instead: `chunked`, `close` (no length: the
//! body ends when the connection closes), `length=N` (a `Content-Length` of N whatever the
//! body's size: a lie), or `endless-chunked` / `endless-close` (the body repeated until the
//! client hangs up, or [`ENDLESS_CAP`] bytes). Bytes of bodies written are counted in
//! [`Fake::sent`].

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The pseudo-header of an answer that says how its body is framed.
pub const FRAMING: &str = "X-Fake-Framing";
/// Where an endless body stops anyway (a client that reads it all fails its test).
pub const ENDLESS_CAP: u64 = 64 << 20;

/// One request as received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// An answer: status, headers, body.
pub type Answer = (u16, Vec<(String, String)>, Vec<u8>);

pub struct Fake {
    pub port: u16,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Body bytes written to clients (accepted by the socket, not necessarily read).
    pub sent: Arc<AtomicU64>,
}

impl Fake {
    pub fn start(handler: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let sent = Arc::new(AtomicU64::new(0));
        let counter = sent.clone();
        let handler = Arc::new(handler);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (log, handler, counter) = (log.clone(), handler.clone(), counter.clone());
                std::thread::spawn(move || serve(conn, &log, &*handler, &counter));
            }
        });
        Fake { port, seen, sent }
    }

    /// The requests whose path starts with `prefix`.
    pub fn count(&self, method: &str, prefix: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.method == method && s.path.starts_with(prefix))
            .count()
    }
}

fn serve(
    mut conn: TcpStream,
    log: &Mutex<Vec<Seen>>,
    handler: &dyn Fn(&Seen) -> Answer,
    sent: &AtomicU64,
) {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut b) {
            // A TLS handshake (the client tries HTTPS first on loopback): not ours.
            Ok(1) if head.is_empty() && b[0] == 0x16 => return,
            Ok(1) if head.len() < 65536 => head.push(b[0]),
            _ => return,
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut lines = text.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let method = first.next().unwrap_or("").to_owned();
    let path = first.next().unwrap_or("").to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let seen = Seen {
        method,
        path,
        headers,
    };
    log.lock().unwrap().push(seen.clone());
    let (status, hdrs, body) = handler(&seen);
    let framing = hdrs
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(FRAMING))
        .map_or(String::new(), |(_, v)| v.clone());
    let mut out = format!("HTTP/1.1 {status} X\r\nConnection: close\r\n");
    match framing.as_str() {
        "" => out.push_str(&format!("Content-Length: {}\r\n", body.len())),
        "chunked" | "endless-chunked" => out.push_str("Transfer-Encoding: chunked\r\n"),
        "close" | "endless-close" => {}
        f => {
            let n = f.strip_prefix("length=").expect("a known framing");
            out.push_str(&format!("Content-Length: {n}\r\n"));
        }
    }
    for (k, v) in hdrs
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case(FRAMING))
    {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    if conn.write_all(out.as_bytes()).is_err() || seen.method == "HEAD" {
        return;
    }
    let chunked = framing.ends_with("chunked");
    let mut write = |part: &[u8]| -> bool {
        let ok = if chunked {
            let size = format!("{:x}\r\n", part.len());
            conn.write_all(size.as_bytes()).is_ok()
                && conn.write_all(part).is_ok()
                && conn.write_all(b"\r\n").is_ok()
        } else {
            conn.write_all(part).is_ok()
        };
        if ok {
            sent.fetch_add(part.len() as u64, Ordering::Relaxed);
        }
        ok
    };
    if framing.starts_with("endless") {
        assert!(!body.is_empty(), "an endless body repeats a non-empty one");
        let mut total = 0;
        while total < ENDLESS_CAP && write(&body) {
            total += body.len() as u64;
        }
        return;
    }
    let ok = if chunked {
        body.chunks(8192).all(&mut write)
    } else {
        body.is_empty() || write(&body)
    };
    if ok && chunked {
        let _ = conn.write_all(b"0\r\n\r\n");
    }
}
