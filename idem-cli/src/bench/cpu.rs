//! The engine's CPU time, read before and after a phase of `idem bench --saturation`.

use std::time::Duration;

use idemkit::StoreUrl;
use idemkit::redis::redis;

use super::BoxError;
use super::raw::Raw;

/// Where the engine's CPU time is read.
pub(super) enum Cpu {
    /// SQLite runs in this process: its CPU (the bench's own callers included, for idem and
    /// the bare statements alike).
    ThisProcess,
    /// A PostgreSQL server on this machine: every `postgres` process (backends, WAL writer,
    /// checkpointer).
    PostgresProcesses,
    /// Redis: the server's own count (`INFO cpu`), wherever it runs.
    RedisInfo(redis::aio::ConnectionManager),
}

impl Cpu {
    /// How the engine behind `raw` reports its CPU, if it does: PostgreSQL only on this machine.
    pub(super) fn of(raw: &Raw, url: &StoreUrl) -> Option<Cpu> {
        match raw {
            Raw::Sqlite(_) => Some(Cpu::ThisProcess),
            Raw::Postgres(_) => {
                let url = reqwest::Url::parse(url.expose_secret()).ok()?;
                // No host: a Unix socket, on this machine.
                let local = url
                    .host_str()
                    .is_none_or(|h| matches!(h, "127.0.0.1" | "localhost" | "[::1]" | "::1"));
                local.then_some(Cpu::PostgresProcesses)
            }
            Raw::Redis(conn) => Some(Cpu::RedisInfo(conn.clone())),
        }
    }

    /// For the report.
    pub(super) fn whose(&self) -> &'static str {
        match self {
            Cpu::ThisProcess => "this process (SQLite runs in it; the callers' own CPU included)",
            Cpu::PostgresProcesses => "the PostgreSQL server's processes on this machine",
            Cpu::RedisInfo(_) => "the Redis server (INFO cpu: used_cpu_user + used_cpu_sys)",
        }
    }

    /// CPU time used so far (`None` where `/proc` cannot be read).
    pub(super) async fn read(&self) -> Result<Option<Duration>, BoxError> {
        Ok(match self {
            Cpu::ThisProcess => proc_cpu(&std::fs::read_to_string("/proc/self/stat")?),
            Cpu::PostgresProcesses => {
                let mut total = Duration::ZERO;
                for entry in std::fs::read_dir("/proc")?.flatten() {
                    // Processes come and go between the listing and the read: skip those.
                    if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat"))
                        && stat.contains(" (postgres) ")
                    {
                        total += proc_cpu(&stat).unwrap_or_default();
                    }
                }
                Some(total)
            }
            Cpu::RedisInfo(conn) => {
                let mut conn = conn.clone();
                let info: String = redis::cmd("INFO").arg("cpu").query_async(&mut conn).await?;
                let field = |name: &str| {
                    info.lines()
                        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                        .and_then(|v| v.trim().parse::<f64>().ok())
                };
                field("used_cpu_user")
                    .zip(field("used_cpu_sys"))
                    .map(|(u, s)| Duration::from_secs_f64(u + s))
            }
        })
    }
}

/// User + system CPU from a `/proc/PID/stat` line (fields 14 and 15, in clock ticks of 1/100 s:
/// Linux's `USER_HZ` is 100 on every architecture it exports to user space).
fn proc_cpu(stat: &str) -> Option<Duration> {
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis
    // start at field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_cpu_reads_user_and_system_ticks_past_a_name_with_spaces() {
        let stat = "4242 (postgres: x (y)) S 1 4242 4242 0 -1 4194560 10 0 0 0 150 25 0 0 20 0";
        assert_eq!(proc_cpu(stat), Some(Duration::from_millis(1750)));
        assert_eq!(proc_cpu("4242 (postgres) S 1"), None);
    }
}
