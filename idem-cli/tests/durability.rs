//! `idem conformance --store URL` warns about the server settings that can lose an acknowledged
//! claim, against servers this test starts itself with those settings (free loopback ports, temp
//! dirs; the shared servers are never touched).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use idem_conformance::kit::{self, free_port, skip};

fn idem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .output()
        .unwrap()
}

/// `idem conformance --store url`, which must pass: the warnings it printed.
fn conformance_warnings(url: &str) -> Vec<String> {
    let out = idem(&["conformance", "--store", url]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter(|l| l.starts_with("warning: "))
        .map(str::to_owned)
        .collect()
}

fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    for _ in 0..600 {
        if ready() {
            return;
        }
        // Real servers starting up: nothing to inject.
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} never happened");
}

fn sh(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Output {
    Command::new(program).args(args).output().unwrap()
}

struct Redis {
    ports: Vec<u16>,
    dir: PathBuf,
}

impl Drop for Redis {
    fn drop(&mut self) {
        for p in &self.ports {
            let _ = sh("redis-cli", &["-p", &p.to_string(), "shutdown", "nosave"]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn redis_server(dir: &Path, port: u16, extra: &[&str]) {
    let d = dir.join(port.to_string());
    std::fs::create_dir_all(&d).unwrap();
    let d = d.display().to_string();
    let port = port.to_string();
    let mut args = vec![
        "--port",
        &port,
        "--bind",
        "127.0.0.1",
        "--dir",
        &d,
        "--daemonize",
        "yes",
        "--save",
        "",
        "--appendonly",
        "no",
    ];
    args.extend_from_slice(extra);
    let out = sh("redis-server", &args);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn conformance_warns_about_redis_replicas_eviction_and_no_persistence() {
    if sh("redis-server", &["--version"]).status.code() != Some(0) {
        return skip("redis-server is not installed");
    }
    let dir = kit::temp_dir("idem-cli-redis-durability").keep();
    let (master, replica) = (free_port(), free_port());
    let servers = Redis {
        ports: vec![replica, master],
        dir: dir.clone(),
    };
    redis_server(&dir, master, &["--maxmemory-policy", "allkeys-lru"]);
    let master_addr = master.to_string();
    redis_server(&dir, replica, &["--replicaof", "127.0.0.1", &master_addr]);
    wait_until("the replica streaming", || {
        let out = sh("redis-cli", &["-p", &master_addr, "info", "replication"]);
        String::from_utf8_lossy(&out.stdout).contains("state=online")
    });
    let warnings = conformance_warnings(&format!("redis://127.0.0.1:{master}"));
    for (setting, risk) in [
        (
            "replicate asynchronously",
            "a failover can lose an acknowledged claim",
        ),
        ("maxmemory-policy is allkeys-lru", "evict"),
        ("persistence is off", "a restart loses every"),
    ] {
        assert!(
            warnings
                .iter()
                .any(|w| w.contains(setting) && w.contains(risk)),
            "no warning about {setting:?}: {warnings:#?}"
        );
    }
    drop(servers);
}

struct Postgres {
    bin: PathBuf,
    dir: PathBuf,
    as_postgres: bool,
    receiver: Option<std::process::Child>,
}

impl Postgres {
    fn run(&self, program: &str, args: &[&str]) -> Output {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut all = vec!["-u", "postgres", "--", path.to_str().unwrap()];
            all.extend_from_slice(args);
            sh("runuser", &all)
        } else {
            sh(path, args)
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(mut r) = self.receiver.take() {
            let _ = r.kill();
            let _ = r.wait();
        }
        let data = self.dir.join("data").display().to_string();
        let _ = self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn conformance_warns_about_postgres_synchronous_commit_off_and_asynchronous_replicas() {
    let Some(bin) =
        kit::env_url("IDEM_TEST_PG_BINDIR", "the PostgreSQL binaries").map(PathBuf::from)
    else {
        return;
    };
    let dir = kit::temp_dir("idem-cli-pg-durability").keep();
    let as_postgres = sh("id", &["-u"]).stdout.starts_with(b"0");
    if as_postgres {
        assert!(
            sh("chown", &["postgres", dir.to_str().unwrap()])
                .status
                .success()
        );
    }
    let mut pg = Postgres {
        bin,
        dir: dir.clone(),
        as_postgres,
        receiver: None,
    };
    let data = dir.join("data").display().to_string();
    let out = pg.run(
        "initdb",
        &[
            "-D",
            &data,
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let port = free_port().to_string();
    let opts = format!(
        "-p {port} -k {} -c listen_addresses=127.0.0.1 -c synchronous_commit=off -c fsync=off",
        dir.display()
    );
    let log = dir.join("server.log").display().to_string();
    let out = pg.run(
        "pg_ctl",
        &["-D", &data, "-l", &log, "-o", &opts, "-w", "start"],
    );
    assert!(out.status.success(), "{out:?}");
    // A replication client streaming asynchronously (a standby without the standby's cost).
    let wal = dir.join("wal");
    std::fs::create_dir_all(&wal).unwrap();
    pg.receiver = Some(
        Command::new(pg.bin.join("pg_receivewal"))
            .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-D"])
            .arg(&wal)
            .spawn()
            .unwrap(),
    );
    wait_until("pg_receivewal streaming", || {
        let out = sh(
            "psql",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-Atqc",
                "select count(*) from pg_stat_replication",
            ],
        );
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    });
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let migrated = idem(&["migrate", "--store", &url]);
    assert!(migrated.status.success(), "{migrated:?}");
    let warnings = conformance_warnings(&url);
    for (setting, risk) in [
        ("synchronous_commit is off", "a server crash can lose it"),
        (
            "stream asynchronously (synchronous_standby_names is empty)",
            "a failover can promote",
        ),
        ("fsync is off", "lose or corrupt"),
    ] {
        assert!(
            warnings
                .iter()
                .any(|w| w.contains(setting) && w.contains(risk)),
            "no warning about {setting:?}: {warnings:#?}"
        );
    }
    drop(pg);
}
