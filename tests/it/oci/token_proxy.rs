//! A bearer-token front for an anonymous test registry, as hosted registries work: every
//! `/v2/` request without a valid token gets 401 with
//! `WWW-Authenticate: Bearer realm="http://127.0.0.1:P/token",service=…,scope=…`; `/token`
//! issues tokens to the right basic credentials (answering with `expires_in`), and requests
//! with a live token are forwarded to the registry. Tokens die on the proxy's side after
//! `uses` requests, whatever the answer said (so a client meets a 401 with a token it thought
//! valid). It can also answer the next N registry requests with 429 and `Retry-After: 1`.
//! One request per connection (answers say `Connection: close`); std threads only. `redirect`
//! reads requests and answers with the same functions.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

struct Shared {
    upstream: u16,
    port: u16,
    user: String,
    password: String,
    /// What the token answer says (`expires_in`).
    advertised: u64,
    /// How many requests the proxy accepts a token for.
    uses: u64,
    tokens: Mutex<Vec<(String, u64)>>,
    issued: AtomicU64,
    refused_tokens: AtomicU64,
    bad_credentials: AtomicU64,
    throttle: AtomicU64,
    throttled: AtomicU64,
    stop: AtomicBool,
}

pub struct TokenProxy {
    shared: Arc<Shared>,
    pub port: u16,
}

pub(crate) struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub(crate) fn read_request(s: &mut TcpStream) -> Option<Request> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).ok()? == 0 || head.len() > 64 << 10 {
            return None;
        }
        // A TLS handshake (the client tries HTTPS first on loopback): close, as a plain HTTP
        // server would after its 400.
        if head.is_empty() && byte[0] == 0x16 {
            return None;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8(head).ok()?;
    let mut lines = text.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let path = first.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).ok()?;
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}

pub(crate) fn answer(s: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let _ = s.write_all(out.as_bytes());
    let _ = s.write_all(body);
    let _ = s.shutdown(Shutdown::Write);
}

impl TokenProxy {
    /// A front for the registry on `upstream`, accepting `user`/`password` at `/token`.
    pub fn start(
        upstream: u16,
        user: &str,
        password: &str,
        advertised: u64,
        uses: u64,
    ) -> TokenProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream,
            port,
            user: user.into(),
            password: password.into(),
            advertised,
            uses,
            tokens: Mutex::new(Vec::new()),
            issued: AtomicU64::new(0),
            refused_tokens: AtomicU64::new(0),
            bad_credentials: AtomicU64::new(0),
            throttle: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
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
                        serve(&sh, &mut conn, req);
                    }
                });
            }
        });
        TokenProxy { shared, port }
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Answer the next `n` registry requests with 429 and `Retry-After: 1`.
    pub fn throttle(&self, n: u64) {
        self.shared.throttle.store(n, Ordering::SeqCst);
    }

    pub fn throttled(&self) -> u64 {
        self.shared.throttled.load(Ordering::SeqCst)
    }

    pub fn issued(&self) -> u64 {
        self.shared.issued.load(Ordering::SeqCst)
    }

    /// Requests that came with a token the proxy no longer accepts.
    pub fn refused_tokens(&self) -> u64 {
        self.shared.refused_tokens.load(Ordering::SeqCst)
    }

    pub fn bad_credentials(&self) -> u64 {
        self.shared.bad_credentials.load(Ordering::SeqCst)
    }
}

impl Drop for TokenProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(sh: &Shared, conn: &mut TcpStream, req: Request) {
    use base64::Engine;
    if req.path.starts_with("/token") {
        let want = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", sh.user, sh.password))
        );
        if req.header("authorization") != Some(want.as_str())
            || !req.path.contains("scope=repository")
        {
            sh.bad_credentials.fetch_add(1, Ordering::SeqCst);
            return answer(
                conn,
                "401 Unauthorized",
                &[],
                b"{\"details\":\"bad credentials\"}",
            );
        }
        let n = sh.issued.fetch_add(1, Ordering::SeqCst);
        let token = format!("tok{n}");
        sh.tokens.lock().unwrap().push((token.clone(), 0));
        let body = format!("{{\"token\":\"{token}\",\"expires_in\":{}}}", sh.advertised);
        return answer(
            conn,
            "200 OK",
            &[("Content-Type", "application/json".into())],
            body.as_bytes(),
        );
    }
    let live = req
        .header("authorization")
        .and_then(|a| a.strip_prefix("Bearer "))
        .map(|t| {
            let mut tokens = sh.tokens.lock().unwrap();
            match tokens.iter_mut().find(|(v, _)| v == t) {
                Some((_, used)) if *used < sh.uses => {
                    *used += 1;
                    Ok(())
                }
                Some(_) => Err(true),
                None => Err(false),
            }
        });
    match live {
        Some(Ok(())) => {}
        other => {
            if matches!(other, Some(Err(true))) {
                sh.refused_tokens.fetch_add(1, Ordering::SeqCst);
            }
            let challenge = format!(
                "Bearer realm=\"http://127.0.0.1:{}/token\",service=\"kpack-test\",scope=\"repository:x:pull\"",
                sh.port
            );
            let body =
                br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#;
            return answer(
                conn,
                "401 Unauthorized",
                &[
                    ("WWW-Authenticate", challenge),
                    ("Content-Type", "application/json".into()),
                ],
                body,
            );
        }
    }
    if req.path != "/v2/"
        && sh
            .throttle
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    {
        sh.throttled.fetch_add(1, Ordering::SeqCst);
        let body = br#"{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}"#;
        return answer(
            conn,
            "429 Too Many Requests",
            &[("Retry-After", "1".into())],
            body,
        );
    }
    // Forward to the registry, one request per connection.
    let Ok(mut up) = TcpStream::connect(("127.0.0.1", sh.upstream)) else {
        return answer(conn, "502 Bad Gateway", &[], b"");
    };
    let mut out = format!("{} {} HTTP/1.1\r\n", req.method, req.path);
    for (k, v) in &req.headers {
        if !k.eq_ignore_ascii_case("authorization") && !k.eq_ignore_ascii_case("connection") {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
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
