//! The server settings a claim's durability depends on, read and judged:
//! [`PostgresStore::check_config`].

use std::fmt;

use idem_core::StoreError;
use sqlx::Row;

use crate::PostgresStore;
use crate::error::classify;

/// The settings read from the server the store writes to, as its connections see them (a
/// setting made per role, per database or in the connection string counts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerConfig {
    /// `synchronous_commit`: `on`, `remote_apply`, `remote_write`, `local` or `off`.
    pub synchronous_commit: String,
    /// `synchronous_standby_names`; empty when no standby is synchronous.
    pub synchronous_standby_names: String,
    /// `fsync`.
    pub fsync: bool,
    /// Whether the server is itself a standby (`pg_is_in_recovery()`).
    pub in_recovery: bool,
    /// Replication connections streaming from it (`pg_stat_replication`), by `sync_state`.
    pub replicas: Vec<Replica>,
}

/// One row of `pg_stat_replication`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Replica {
    /// Its `application_name` (what `synchronous_standby_names` matches).
    pub application_name: String,
    /// `async`, `potential`, `sync` or `quorum` (empty when the role may not see it).
    pub sync_state: String,
}

/// A setting that can lose an acknowledged claim, so that a retry runs the operation again.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DurabilityWarning {
    /// `synchronous_commit = off`: a commit is acknowledged before its WAL is flushed; a server
    /// crash loses the last acknowledged claims and outcomes.
    SynchronousCommitOff,
    /// `synchronous_commit = local` while synchronous standbys are named: commits do not wait
    /// for them, so a failover can lose acknowledged claims.
    SynchronousCommitLocal {
        /// How many replicas stream from the server.
        replicas: usize,
    },
    /// Standbys stream from the server but none is synchronous (`synchronous_standby_names` is
    /// empty): replication is asynchronous and a failover can promote a standby that never
    /// received an acknowledged claim.
    AsynchronousReplicas {
        /// How many replicas stream from the server.
        replicas: usize,
    },
    /// `synchronous_standby_names` is set but no connected standby is synchronous: every commit
    /// waits (hangs) until one connects.
    NoSynchronousStandby {
        /// The setting.
        names: String,
    },
    /// `fsync = off`: a crash of the server's machine can lose or corrupt committed records.
    FsyncOff,
    /// The server is a standby in recovery: it refuses writes.
    InRecovery,
}

impl fmt::Display for DurabilityWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SynchronousCommitOff => f.write_str(
                "synchronous_commit is off: a claim is acknowledged before it is flushed, and a server \
                 crash can lose it, so the retry runs the operation a second time; set synchronous_commit = on",
            ),
            Self::SynchronousCommitLocal { replicas } => write!(
                f,
                "synchronous_commit is local with {replicas} replica(s): commits do not wait for the \
                 synchronous standby, so a failover can lose an acknowledged claim and the retry runs \
                 the operation a second time; set synchronous_commit = on (or remote_apply)"
            ),
            Self::AsynchronousReplicas { replicas } => write!(
                f,
                "{replicas} replica(s) stream asynchronously (synchronous_standby_names is empty): a \
                 failover can promote a standby that never received an acknowledged claim, and the \
                 retry runs the operation a second time; name the standby in synchronous_standby_names"
            ),
            Self::NoSynchronousStandby { names } => write!(
                f,
                "synchronous_standby_names is {names:?} but no connected standby is synchronous: every \
                 commit waits until one connects"
            ),
            Self::FsyncOff => f.write_str(
                "fsync is off: a crash of the server's machine can lose or corrupt committed claims; \
                 set fsync = on",
            ),
            Self::InRecovery => {
                f.write_str("the server is a standby in recovery: it refuses every write")
            }
        }
    }
}

/// What [`PostgresStore::check_config`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DurabilityReport {
    /// The settings read.
    pub server: ServerConfig,
    /// What can lose a claim.
    pub warnings: Vec<DurabilityWarning>,
}

impl DurabilityReport {
    /// Whether nothing was found to warn about.
    pub fn is_safe(&self) -> bool {
        self.warnings.is_empty()
    }

    fn judge(server: ServerConfig) -> Self {
        let mut warnings = Vec::new();
        let replicas = server.replicas.len();
        let names = server.synchronous_standby_names.trim();
        if server.in_recovery {
            warnings.push(DurabilityWarning::InRecovery);
        }
        match server.synchronous_commit.as_str() {
            "off" => warnings.push(DurabilityWarning::SynchronousCommitOff),
            "local" if replicas > 0 && !names.is_empty() => {
                warnings.push(DurabilityWarning::SynchronousCommitLocal { replicas })
            }
            _ => {}
        }
        if replicas > 0 && names.is_empty() {
            warnings.push(DurabilityWarning::AsynchronousReplicas { replicas });
        }
        if !names.is_empty()
            && !server
                .replicas
                .iter()
                .any(|r| matches!(r.sync_state.as_str(), "sync" | "quorum"))
        {
            warnings.push(DurabilityWarning::NoSynchronousStandby {
                names: names.to_owned(),
            });
        }
        if !server.fsync {
            warnings.push(DurabilityWarning::FsyncOff);
        }
        Self { server, warnings }
    }
}

impl PostgresStore {
    /// Reads the settings a claim's durability depends on, as the store's connections see them
    /// (`synchronous_commit`, `synchronous_standby_names`, `fsync`, `pg_is_in_recovery()` and the
    /// rows of `pg_stat_replication`), and reports what can lose an acknowledged claim:
    /// `synchronous_commit = off`, `local` with synchronous standbys named, standbys that stream
    /// asynchronously, a synchronous standby named but absent, `fsync = off`. Warnings are values,
    /// not errors; an unreachable server is [`StoreError::Unavailable`].
    ///
    /// A role without `pg_monitor` sees the rows of `pg_stat_replication` but not their
    /// `sync_state`: grant it to the role that runs the check.
    pub async fn check_config(&self) -> Result<DurabilityReport, StoreError> {
        let op = "config check";
        let mut c = self.pool.acquire().await.map_err(|e| classify(op, e))?;
        let row = sqlx::query(
            "SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'), \
             current_setting('fsync'), pg_is_in_recovery()",
        )
        .fetch_one(&mut *c)
        .await
        .map_err(|e| classify(op, e))?;
        let replicas = sqlx::query(
            "SELECT coalesce(application_name, ''), coalesce(sync_state, '') FROM pg_stat_replication",
        )
        .fetch_all(&mut *c)
        .await
        .map_err(|e| classify(op, e))?
        .into_iter()
        .map(|r| Replica {
            application_name: r.get(0),
            sync_state: r.get(1),
        })
        .collect();
        let fsync: String = row.get(2);
        Ok(DurabilityReport::judge(ServerConfig {
            synchronous_commit: row.get(0),
            synchronous_standby_names: row.get(1),
            fsync: fsync == "on",
            in_recovery: row.get(3),
            replicas,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(commit: &str, names: &str, states: &[&str]) -> ServerConfig {
        ServerConfig {
            synchronous_commit: commit.into(),
            synchronous_standby_names: names.into(),
            fsync: true,
            in_recovery: false,
            replicas: states
                .iter()
                .map(|s| Replica {
                    application_name: "standby1".into(),
                    sync_state: (*s).into(),
                })
                .collect(),
        }
    }

    fn judge(s: ServerConfig) -> Vec<DurabilityWarning> {
        DurabilityReport::judge(s).warnings
    }

    #[test]
    fn judgement() {
        use DurabilityWarning::*;
        assert!(judge(server("on", "", &[])).is_empty());
        assert!(judge(server("on", "standby1", &["sync"])).is_empty());
        assert_eq!(judge(server("off", "", &[])), vec![SynchronousCommitOff]);
        assert_eq!(
            judge(server("on", "", &["async"])),
            vec![AsynchronousReplicas { replicas: 1 }]
        );
        assert_eq!(
            judge(server("local", "standby1", &["sync"])),
            vec![SynchronousCommitLocal { replicas: 1 }]
        );
        assert_eq!(
            judge(server("on", "standby1", &[])),
            vec![NoSynchronousStandby {
                names: "standby1".into()
            }]
        );
    }
}
