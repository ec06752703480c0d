//! A private `redis-server` the test itself starts (never the shared one on 6379), so it can be
//! killed and restarted.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use idem_conformance::kit::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A `redis-server` child process on a free loopback port, its data in a temp dir of its own.
/// Killed and its files removed on drop.
pub struct TestServer {
    bin: PathBuf,
    port: u16,
    /// Removed when the server is dropped, after it is killed.
    dir: TempDir,
    args: Vec<String>,
    child: Option<Child>,
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

impl TestServer {
    /// Starts `redis-server` with `args` on top of the port and dir settings; `None` (after
    /// saying why) if it is not on PATH; a failure under `CI`.
    pub async fn start(args: &[&str]) -> Option<Self> {
        let Some(bin) = find_on_path("redis-server") else {
            idem_conformance::kit::skip("redis-server is not on PATH (scripts/test installs it)");
            return None;
        };
        let port = idem_conformance::kit::free_port();
        let dir = idem_conformance::kit::temp_dir("idem-redis-fault");
        let mut server = Self {
            bin,
            port,
            dir,
            args: args.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        server.restart().await;
        Some(server)
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server at once (SIGKILL: no shutdown save) and waits for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and data, and waits until it answers `PING`
    /// (after loading its data).
    pub async fn restart(&mut self) {
        self.kill();
        let child = Command::new(&self.bin)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--daemonize", "no", "--logfile", "server.log"])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        self.wait_ready().await;
    }

    async fn wait_ready(&self) {
        // Waiting for a process to start is real time; nothing logical depends on it.
        for _ in 0..1500 {
            if self.ping().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("redis-server on port {} never answered PING", self.port);
    }

    async fn ping(&self) -> bool {
        let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await else {
            return false;
        };
        if s.write_all(b"PING\r\n").await.is_err() {
            return false;
        }
        let mut buf = [0u8; 64];
        // NOAUTH: up, and guarded by a password. LOADING: still reading its data.
        matches!(s.read(&mut buf).await,
            Ok(n) if buf[..n].starts_with(b"+PONG") || buf[..n].starts_with(b"-NOAUTH"))
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill();
    }
}
