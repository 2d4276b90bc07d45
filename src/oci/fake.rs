//! A tiny HTTP/1.1 server on 127.0.0.1 for the client's unit tests (redirects across origins,
//! ranges, refusals): each connection carries one request, answered by a closure, and every
//! request is recorded with its headers. The push tests against a real registry are in
//! tests/it/oci/.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

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
}

impl Fake {
    pub fn start(handler: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let handler = Arc::new(handler);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (log, handler) = (log.clone(), handler.clone());
                std::thread::spawn(move || serve(conn, &log, &*handler));
            }
        });
        Fake { port, seen }
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

fn serve(mut conn: TcpStream, log: &Mutex<Vec<Seen>>, handler: &dyn Fn(&Seen) -> Answer) {
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
    let mut out = format!(
        "HTTP/1.1 {status} X\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in hdrs {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let _ = conn.write_all(out.as_bytes());
    if seen.method != "HEAD" {
        let _ = conn.write_all(&body);
    }
}
