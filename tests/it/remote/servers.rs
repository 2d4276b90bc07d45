//! Real servers on 127.0.0.1 for the remote-source tests, started and stopped by the tests:
//! nginx serving a directory (with an access log of every range sent), moto's S3 server with
//! signature checking (`s3_server.py`), and a TCP proxy that can delay answers. A server that
//! cannot start fails the test: these tests never skip (scripts/setup-deps.sh installs them).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A port free right now on 127.0.0.1.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until `port` accepts connections; fails with `log` if `child` exits first.
fn wait_listening(port: u16, child: &mut Child, what: &str, log: &dyn Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited with {status} before listening:\n{}", log());
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not listen on {port}:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// nginx serving `root` on a loopback port, logging `METHOD URI RANGE STATUS BYTES_SENT`.
pub struct Nginx {
    dir: tempfile::TempDir,
    pub port: u16,
    child: Child,
}

impl Nginx {
    pub fn start(root: &Path) -> Nginx {
        Nginx::start_with(root, true, None)
    }

    /// With `etag` false, nginx sends no ETag: versions are told by Last-Modified and length.
    /// With `tls` (a directory holding `cert.pem` and `key.pem`), it serves HTTPS.
    pub fn start_with(root: &Path, etag: bool, tls: Option<&Path>) -> Nginx {
        Nginx::start_conf(root, etag, tls, "")
    }

    /// Sends every answer at most `bytes_per_second` (nginx's `limit_rate`): a slow link.
    pub fn start_rate_limited(root: &Path, bytes_per_second: u64) -> Nginx {
        Nginx::start_conf(root, true, None, &format!("limit_rate {bytes_per_second};"))
    }

    fn start_conf(root: &Path, etag: bool, tls: Option<&Path>, extra: &str) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let d = dir.path().display();
        let conf = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log;\nevents {{ worker_connections 256; }}\n\
             http {{\n  log_format ranges '$request_method $uri $http_range $status $body_bytes_sent';\n\
               access_log {d}/access.log ranges;\n  client_body_temp_path {d}/body;\n\
               proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fcgi;\n\
               uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
               etag {};\n  server {{ listen 127.0.0.1:{port}{}; root {}; {} {extra} }}\n}}\n",
            if etag { "on" } else { "off" },
            if tls.is_some() { " ssl" } else { "" },
            root.display(),
            tls.map_or(String::new(), |t| format!(
                "ssl_certificate {}/cert.pem; ssl_certificate_key {}/key.pem;",
                t.display(),
                t.display()
            )),
        );
        std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
        let bin = ["/usr/sbin/nginx", "nginx"]
            .into_iter()
            .find(|b| Path::new(b).exists())
            .unwrap_or("nginx");
        let mut child = Command::new(bin)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(dir.path().join("nginx.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("stderr")).unwrap())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start nginx ({e}): scripts/setup-deps.sh installs it")
            });
        let errors = dir.path().to_path_buf();
        wait_listening(port, &mut child, "nginx", &|| {
            std::fs::read_to_string(errors.join("stderr")).unwrap_or_default()
                + &std::fs::read_to_string(errors.join("error.log")).unwrap_or_default()
        });
        Nginx { dir, port, child }
    }

    pub fn url(&self, rel: &str) -> String {
        format!("http://127.0.0.1:{}/{rel}", self.port)
    }

    pub fn https_url(&self, rel: &str) -> String {
        format!("https://127.0.0.1:{}/{rel}", self.port)
    }

    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }

    /// Body bytes sent so far, summed over the access log.
    pub fn bytes_sent(&self) -> u64 {
        self.access_log()
            .lines()
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// A certificate authority and a server certificate for 127.0.0.1 signed by it, made with the
/// `openssl` command in `dir`: `ca.pem`, and `cert.pem` + `key.pem` for the server.
pub fn tls_files(dir: &Path) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run openssl ({e}): scripts/setup-deps.sh installs it")
            });
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=kpack test CA",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "key.pem",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "cert.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
}

/// moto's S3 server with authentication on, one bucket, and a key pair to use.
pub struct Moto {
    /// Holds the server's log.
    _dir: tempfile::TempDir,
    pub port: u16,
    pub key_id: String,
    pub secret: String,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Moto {
    pub fn start(bucket: &str) -> Moto {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/remote/s3_server.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .arg(port.to_string())
            .arg(bucket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("server.log")).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start python3 ({e})"));
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
        let mut words = line.split_whitespace();
        assert_eq!(
            words.next(),
            Some("READY"),
            "moto did not start (scripts/setup-deps.sh installs moto[server]): {line}\n{log}"
        );
        let (key_id, secret) = (
            words.next().unwrap().to_owned(),
            words.next().unwrap().to_owned(),
        );
        let log_dir = dir.path().to_path_buf();
        wait_listening(port, &mut child, "moto", &|| {
            std::fs::read_to_string(log_dir.join("server.log")).unwrap_or_default()
        });
        Moto {
            _dir: dir,
            port,
            key_id,
            secret,
            child,
            stdin,
            stdout,
        }
    }

    fn command(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).unwrap();
        assert_eq!(answer.trim(), "OK", "moto: {line}: {answer}");
    }

    /// Uploads `file` as `key` (replacing any object there).
    pub fn put(&mut self, key: &str, file: &Path) {
        self.command(&format!("put {key} {}", file.display()));
    }

    /// The environment of a client of this server: the key pair (or `secret` instead), the
    /// endpoint, and nothing else to look at (no instance metadata, no shared files).
    pub fn env(&self, endpoint_port: u16, secret: Option<&str>) -> Vec<(String, String)> {
        [
            ("AWS_ACCESS_KEY_ID", self.key_id.clone()),
            (
                "AWS_SECRET_ACCESS_KEY",
                secret.unwrap_or(&self.secret).to_owned(),
            ),
            (
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{endpoint_port}"),
            ),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
            ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent".into()),
            ("AWS_CONFIG_FILE", "/nonexistent".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// Stops (SIGSTOP) or resumes (SIGCONT) the server process.
    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child by its pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        kill(&mut self.child);
    }
}

/// A TCP proxy on loopback that holds every chunk of the server's answers for `delay`, or
/// answers the next requests itself with an error status.
pub struct SlowProxy {
    pub port: u16,
    delay_ms: Arc<AtomicU64>,
    /// Requests still to answer with `fail_status` instead of forwarding them.
    fail_next: Arc<AtomicU64>,
    fail_status: Arc<AtomicU64>,
    /// Each forwarded request as (its head was read, the last chunk of its answer was about to
    /// be written): the span during which the client was waiting for it.
    spans: Arc<Mutex<Vec<(Instant, Instant)>>>,
    stop: Arc<AtomicBool>,
}

impl SlowProxy {
    pub fn start(upstream: u16) -> SlowProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let delay_ms = Arc::new(AtomicU64::new(0));
        let fail_next = Arc::new(AtomicU64::new(0));
        let fail_status = Arc::new(AtomicU64::new(503));
        let spans = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (d, f, st, fl, s) = (
            delay_ms.clone(),
            fail_next.clone(),
            fail_status.clone(),
            spans.clone(),
            stop.clone(),
        );
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let (d, f, st, fl) = (d.clone(), f.clone(), st.clone(), fl.clone());
                        std::thread::spawn(move || {
                            if let Some(span) = serve(client, upstream, d, f, st) {
                                fl.lock().unwrap().push(span);
                            }
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        SlowProxy {
            port,
            delay_ms,
            fail_next,
            fail_status,
            spans,
            stop,
        }
    }

    /// The most requests that were in flight at once. A span ends when the last chunk of the
    /// answer is about to be written, so the request a client sends only after it has read that
    /// answer is always read later than that (no overlap from the proxy's own thread
    /// scheduling), while a request sent earlier overlaps.
    pub fn max_in_flight(&self) -> u64 {
        let mut events: Vec<(Instant, i64)> = Vec::new();
        for &(start, end) in self.spans.lock().unwrap().iter() {
            events.push((start, 1));
            events.push((end, -1));
        }
        // At the same instant an end counts before a start.
        events.sort();
        let (mut now, mut most) = (0i64, 0i64);
        for (_, delta) in events {
            now += delta;
            most = most.max(now);
        }
        most as u64
    }

    /// Answers the next `n` requests with `status` (and closes their connections).
    pub fn fail_next(&self, n: u64, status: u16) {
        self.fail_status.store(u64::from(status), Ordering::SeqCst);
        self.fail_next.store(n, Ordering::SeqCst);
    }

    pub fn set_delay(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One client connection, carrying one request (forwarded with `Connection: close`): failed
/// while `fail` is positive, else forwarded with its answer delayed.
fn serve(
    mut client: TcpStream,
    upstream: u16,
    delay: Arc<AtomicU64>,
    fail: Arc<AtomicU64>,
    status: Arc<AtomicU64>,
) -> Option<(Instant, Instant)> {
    // The request head (our clients send GETs without bodies).
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match client.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    let received = Instant::now();
    if fail
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        let code = status.load(Ordering::SeqCst);
        let _ = write!(
            client,
            "HTTP/1.1 {code} Injected\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let _ = client.shutdown(Shutdown::Both);
        return None;
    }
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)) else {
        return None;
    };
    // One request per connection, so that every request passes the check above.
    head.truncate(head.len() - 2);
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    if server.write_all(&head).is_err() {
        return None;
    }
    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    std::thread::spawn(move || pump(client, server, None));
    let last_write = pump(s2, c2, Some(delay));
    Some((received, last_write.unwrap_or(received)))
}

/// Copies `from` to `to`, sleeping `delay` before each chunk; closes both at the end. Returns
/// when the last chunk was about to be written.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Option<Arc<AtomicU64>>) -> Option<Instant> {
    let mut buf = vec![0u8; 64 << 10];
    let mut last_write = None;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(d) = &delay {
            let ms = d.load(Ordering::SeqCst);
            if ms > 0 {
                std::thread::sleep(Duration::from_millis(ms));
            }
        }
        last_write = Some(Instant::now());
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
    last_write
}
