//! A fault-injecting HTTP/1.1 proxy on 127.0.0.1 for the remote-source tests: it sits between
//! the mount and a real server (nginx, moto), forwards each request, reads the whole answer, and
//! for some answers to ranged GETs does one of [`Fault`]'s misdeeds instead of passing it on.
//!
//! Whether an answer gets a fault is a hash of the seed, the request line, its `Range` and how
//! many times that same request was seen before, so the same requests are picked whatever order
//! the mount's threads send them in; the kinds take turns, so each is injected equally often. Answers without a body (`HEAD`, errors without one)
//! and anything sent while the proxy is not armed pass through untouched.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does to an answer it picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Sends the head and half the body, then resets the connection (RST).
    Reset,
    /// Sends the head (with the true `Content-Length`) and all but the last part of the body,
    /// then closes the connection normally (FIN).
    ShortBody,
    /// Sends the body with a `Content-Range` one byte off the range that was asked for.
    WrongRange,
    /// Answers `200 OK` with the whole object instead of `206` with the range.
    WholeObject,
    /// Holds the answer for the proxy's delay (longer than the client's timeout), then closes.
    Delay,
    /// Flips one bit of one byte of the body and sends it as if nothing happened.
    FlipByte,
}

pub const FAULTS: [Fault; 6] = [
    Fault::Reset,
    Fault::ShortBody,
    Fault::WrongRange,
    Fault::WholeObject,
    Fault::Delay,
    Fault::FlipByte,
];

struct Shared {
    upstream: u16,
    seed: u64,
    /// Out of 1000 answers, how many get a fault.
    rate: u32,
    armed: AtomicBool,
    delay: Duration,
    /// The whole object, for [`Fault::WholeObject`].
    whole: Vec<u8>,
    /// Other objects for [`Fault::WholeObject`], by a part of their request path (a registry's
    /// blobs, `/blobs/sha256:…`): used instead of `whole` when the request names one.
    objects: Mutex<Vec<(String, Vec<u8>)>>,
    seen: Mutex<HashMap<String, u64>>,
    counts: [AtomicU64; 6],
    passed: AtomicU64,
    /// When set, the only kind injected.
    only: Mutex<Option<Fault>>,
    /// With [`Fault::FlipByte`]: 0 flips one byte of the body, N one byte in every N.
    flip_stride: AtomicU64,
    /// Faults injected so far: the kinds take turns, so each is injected as often as the others.
    injected: AtomicU64,
    stop: AtomicBool,
}

pub struct FaultProxy {
    pub port: u16,
    shared: Arc<Shared>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// A proxy to `127.0.0.1:upstream`, not armed yet, faulting `per_mille` of the answers
    /// once armed. `whole` is the object served (sent whole by [`Fault::WholeObject`]).
    pub fn start(
        upstream: u16,
        seed: u64,
        per_mille: u32,
        delay: Duration,
        whole: Vec<u8>,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let shared = Arc::new(Shared {
            upstream,
            seed,
            rate: per_mille,
            armed: AtomicBool::new(false),
            delay,
            whole,
            objects: Mutex::new(Vec::new()),
            seen: Mutex::new(HashMap::new()),
            counts: Default::default(),
            passed: AtomicU64::new(0),
            injected: AtomicU64::new(0),
            only: Mutex::new(None),
            flip_stride: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let accept = std::thread::spawn(move || {
            while !s.stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let s = s.clone();
                        std::thread::spawn(move || {
                            let _ = serve(client, &s);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FaultProxy {
            port,
            shared,
            accept: Some(accept),
        }
    }

    /// Makes [`Fault::WholeObject`] send `bytes` for requests whose line contains `part`.
    pub fn add_object(&self, part: &str, bytes: Vec<u8>) {
        self.shared
            .objects
            .lock()
            .unwrap()
            .push((part.to_owned(), bytes));
    }

    /// Starts (or stops) injecting faults.
    pub fn arm(&self, on: bool) {
        self.shared.armed.store(on, Ordering::SeqCst);
    }

    /// Injects only `fault` (all kinds in turn with `None`).
    pub fn set_only(&self, fault: Option<Fault>) {
        *self.shared.only.lock().unwrap() = fault;
    }

    /// Makes [`Fault::FlipByte`] flip one byte in every `stride` bytes of a body (0: one byte).
    pub fn set_flip_stride(&self, stride: u64) {
        self.shared.flip_stride.store(stride, Ordering::SeqCst);
    }

    /// How many faults of each kind were injected so far.
    pub fn counts(&self) -> Vec<(Fault, u64)> {
        FAULTS
            .iter()
            .zip(&self.shared.counts)
            .map(|(f, n)| (*f, n.load(Ordering::SeqCst)))
            .collect()
    }

    /// Answers with a body that were passed on untouched.
    pub fn passed(&self) -> u64 {
        self.shared.passed.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// SplitMix64: a hash of one word, good enough to spread faults.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn hash_str(seed: u64, s: &str) -> u64 {
    s.bytes().fold(mix(seed), |h, b| mix(h ^ u64::from(b)))
}

/// One HTTP message head: the start line and the header lines, as sent.
struct Head {
    start: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn read(r: &mut impl BufRead) -> std::io::Result<Option<Head>> {
        let mut start = String::new();
        if r.read_line(&mut start)? == 0 {
            return Ok(None);
        }
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line)? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                break;
            }
            let (k, v) = line.split_once(':').unwrap_or((line, ""));
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        Ok(Some(Head {
            start: start.trim_end_matches(['\r', '\n']).to_owned(),
            headers,
        }))
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn set(&mut self, name: &str, value: String) {
        self.headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
        self.headers.push((name.to_owned(), value));
    }

    fn remove(&mut self, name: &str) {
        self.headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = format!("{}\r\n", self.start);
        for (k, v) in &self.headers {
            out += &format!("{k}: {v}\r\n");
        }
        out += "\r\n";
        out.into_bytes()
    }
}

/// Reads a chunked body, returning it as sent (chunk framing included).
fn read_chunked(r: &mut impl BufRead) -> std::io::Result<Vec<u8>> {
    let mut raw = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line)?;
        raw.extend_from_slice(line.as_bytes());
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|_| std::io::Error::other("bad chunk size"))?;
        if size == 0 {
            // Trailers, then the empty line.
            loop {
                let mut t = String::new();
                r.read_line(&mut t)?;
                raw.extend_from_slice(t.as_bytes());
                if t.trim().is_empty() {
                    return Ok(raw);
                }
            }
        }
        let mut chunk = vec![0u8; size + 2];
        r.read_exact(&mut chunk)?;
        raw.extend_from_slice(&chunk);
    }
}

/// Closes `s` with a reset instead of a normal close.
fn reset(s: TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a correctly sized option value.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(s);
}

/// Forwards the requests of one client connection, one at a time, until either side closes.
fn serve(client: TcpStream, s: &Shared) -> std::io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut from_client = BufReader::new(client.try_clone()?);
    let mut to_client = client;
    let up = TcpStream::connect(("127.0.0.1", s.upstream))?;
    let mut from_up = BufReader::new(up.try_clone()?);
    let mut to_up = up;
    // A TLS handshake (an `oci://` client tries HTTPS first on loopback): close, as a plain
    // HTTP server would, rather than wait for a line that never comes.
    if from_client.fill_buf()?.first() == Some(&0x16) {
        return Ok(());
    }
    loop {
        let Some(req) = Head::read(&mut from_client)? else {
            return Ok(());
        };
        let req_len: usize = req
            .get("Content-Length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut req_body = vec![0u8; req_len];
        from_client.read_exact(&mut req_body)?;
        to_up.write_all(&req.bytes())?;
        to_up.write_all(&req_body)?;

        let Some(mut resp) = Head::read(&mut from_up)? else {
            return Ok(());
        };
        let status: u16 = resp
            .start
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let is_head = req.start.starts_with("HEAD ");
        let bodiless = is_head || status == 204 || status == 304 || status < 200;
        let chunked = resp
            .get("Transfer-Encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
        let mut body = Vec::new();
        if !bodiless {
            if chunked {
                body = read_chunked(&mut from_up)?;
            } else if let Some(n) = resp.get("Content-Length").and_then(|v| v.parse().ok()) {
                body = vec![0u8; n];
                from_up.read_exact(&mut body)?;
            } else {
                from_up.read_to_end(&mut body)?;
            }
        }
        let closing = resp
            .get("Connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));

        let fault = if s.armed.load(Ordering::SeqCst)
            && req.start.starts_with("GET ")
            && status == 206
            && !chunked
            && !body.is_empty()
        {
            let key = format!("{} {}", req.start, req.get("Range").unwrap_or(""));
            let nth = {
                let mut seen = s.seen.lock().unwrap();
                let n = seen.entry(key.clone()).or_insert(0);
                *n += 1;
                *n
            };
            let h = mix(hash_str(s.seed, &key) ^ nth);
            ((h % 1000) < u64::from(s.rate)).then(|| {
                let n = s.injected.fetch_add(1, Ordering::SeqCst);
                let only = *s.only.lock().unwrap();
                (only.unwrap_or(FAULTS[(n % 6) as usize]), h >> 32)
            })
        } else {
            None
        };
        let Some((fault, h)) = fault else {
            if !bodiless {
                s.passed.fetch_add(1, Ordering::SeqCst);
            }
            to_client.write_all(&resp.bytes())?;
            to_client.write_all(&body)?;
            if closing {
                return Ok(());
            }
            continue;
        };
        s.counts[FAULTS.iter().position(|f| *f == fault).unwrap()].fetch_add(1, Ordering::SeqCst);
        match fault {
            Fault::Reset => {
                to_client.write_all(&resp.bytes())?;
                to_client.write_all(&body[..body.len() / 2])?;
                to_client.flush()?;
                reset(to_client);
                return Ok(());
            }
            Fault::ShortBody => {
                to_client.write_all(&resp.bytes())?;
                let keep = body.len() - 1 - (h as usize % body.len().div_ceil(4));
                to_client.write_all(&body[..keep])?;
                let _ = to_client.shutdown(Shutdown::Both);
                return Ok(());
            }
            Fault::WrongRange => {
                let cr = resp.get("Content-Range").unwrap_or("").to_owned();
                let wrong = shifted_range(&cr).unwrap_or_else(|| "bytes 0-0/1".into());
                resp.set("Content-Range", wrong);
                to_client.write_all(&resp.bytes())?;
                to_client.write_all(&body)?;
            }
            Fault::WholeObject => {
                let objects = s.objects.lock().unwrap();
                let whole = objects
                    .iter()
                    .find(|(part, _)| req.start.contains(part.as_str()))
                    .map_or(&s.whole, |(_, bytes)| bytes);
                resp.start = "HTTP/1.1 200 OK".into();
                resp.remove("Content-Range");
                resp.set("Content-Length", whole.len().to_string());
                to_client.write_all(&resp.bytes())?;
                to_client.write_all(whole)?;
            }
            Fault::Delay => {
                std::thread::sleep(s.delay);
                let _ = to_client.write_all(&resp.bytes());
                let _ = to_client.write_all(&body);
                let _ = to_client.shutdown(Shutdown::Both);
                return Ok(());
            }
            Fault::FlipByte => {
                let stride = s.flip_stride.load(Ordering::SeqCst) as usize;
                let stride = if stride == 0 { body.len() } else { stride };
                for block in body.chunks_mut(stride) {
                    let at = h as usize % block.len();
                    block[at] ^= 1 << (h >> 29 & 7);
                }
                to_client.write_all(&resp.bytes())?;
                to_client.write_all(&body)?;
            }
        }
        if closing {
            return Ok(());
        }
    }
}

/// `bytes A-B/N` moved one byte (down when it can, else up).
fn shifted_range(cr: &str) -> Option<String> {
    let rest = cr.strip_prefix("bytes ")?;
    let (span, size) = rest.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
    Some(if a > 0 {
        format!("bytes {}-{}/{size}", a - 1, b - 1)
    } else {
        format!("bytes {}-{}/{size}", a + 1, b + 1)
    })
}
