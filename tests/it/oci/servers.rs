//! A real registry for the `oci://` tests: Debian's `docker-registry` (the CNCF distribution
//! server) on a free port of 127.0.0.1, storing into a temporary directory, optionally behind
//! htpasswd basic authentication; killed when dropped. Its access log (in `log()`) shows every
//! request line. A registry that cannot start fails the test: these tests never skip
//! (scripts/setup-deps.sh installs it).

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct TestRegistry {
    dir: tempfile::TempDir,
    pub port: u16,
    child: Child,
}

impl TestRegistry {
    /// An anonymous registry.
    pub fn start() -> TestRegistry {
        TestRegistry::start_with(None)
    }

    /// With `user`, basic authentication with that user name and password.
    pub fn start_with(user: Option<(&str, &str)>) -> TestRegistry {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let d = dir.path();
        let auth = match user {
            None => String::new(),
            Some((u, p)) => {
                let out = Command::new("htpasswd")
                    .args(["-Bbn", u, p])
                    .output()
                    .unwrap_or_else(|e| {
                        panic!("cannot run htpasswd ({e}): scripts/setup-deps.sh installs it")
                    });
                assert!(out.status.success(), "htpasswd failed");
                std::fs::write(d.join("htpasswd"), out.stdout).unwrap();
                format!(
                    "auth:\n  htpasswd:\n    realm: kpack-test\n    path: {}/htpasswd\n",
                    d.display()
                )
            }
        };
        let cfg = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}/data\n\
             http:\n  addr: 127.0.0.1:{port}\n  secret: kpack-fuse-test\n{auth}",
            d.display()
        );
        std::fs::write(d.join("cfg.yml"), cfg).unwrap();
        let log = std::fs::File::create(d.join("log")).unwrap();
        let mut child = Command::new("docker-registry")
            .arg("serve")
            .arg(d.join("cfg.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start docker-registry ({e}): scripts/setup-deps.sh installs it")
            });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "docker-registry exited with {status}:\n{}",
                    std::fs::read_to_string(d.join("log")).unwrap_or_default()
                );
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                // The port answers: /v2/ must too (200, or 401 with authentication).
                let out = Command::new("curl")
                    .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
                    .arg(format!("http://127.0.0.1:{port}/v2/"))
                    .output()
                    .unwrap();
                let code = String::from_utf8_lossy(&out.stdout).into_owned();
                if code == "200" || code == "401" {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not answer /v2/"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        TestRegistry { dir, port, child }
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Everything the registry logged so far (access log lines included).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// Where the registry's filesystem storage keeps the bytes of blob `digest`
    /// (`sha256:HEX`).
    pub fn blob_file(&self, digest: &str) -> std::path::PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Flips the low bit of byte `at` of the stored blob `digest`: the registry goes on
    /// serving it under its digest, as a damaged disk or a hostile mirror would.
    pub fn damage_blob(&self, digest: &str, at: u64) {
        let path = self.blob_file(digest);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[at as usize] ^= 1;
        std::fs::write(&path, bytes).unwrap();
    }

    /// How many access-log lines show `METHOD` requests whose path contains `part`.
    pub fn requests(&self, method: &str, part: &str) -> usize {
        let start = format!("\"{method} ");
        self.log()
            .lines()
            .filter(|l| {
                l.find(&start)
                    .is_some_and(|i| l[i..].split(' ').nth(1).is_some_and(|p| p.contains(part)))
            })
            .count()
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
