//! The server settings a claim's durability depends on, read and judged (the configuration
//! check of [`Maintenance`](idem_core::Maintenance) for PostgreSQL).

use idem_core::{ConfigWarning, StoreError};
use sqlx::{Row, SqlStr};

use crate::PostgresStore;
use crate::conflict::retry_conflicts;

/// The settings read from the server the store writes to, as its connections see them (a
/// setting made per role, per database or in the connection string counts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServerConfig {
    /// `synchronous_commit`: `on`, `remote_apply`, `remote_write`, `local` or `off`.
    pub(crate) synchronous_commit: String,
    /// `synchronous_standby_names`; empty when no standby is synchronous.
    pub(crate) synchronous_standby_names: String,
    /// `fsync`.
    pub(crate) fsync: bool,
    /// Whether the server is itself a standby (`pg_is_in_recovery()`).
    pub(crate) in_recovery: bool,
    /// Replication connections streaming from it (`pg_stat_replication`), by `sync_state`.
    pub(crate) replicas: Vec<Replica>,
}

/// One row of `pg_stat_replication`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Replica {
    /// `async`, `potential`, `sync` or `quorum` (empty when the role may not see it).
    pub(crate) sync_state: String,
}

/// A setting that can lose an acknowledged claim, so that a retry runs the operation again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DurabilityWarning {
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

impl DurabilityWarning {
    /// The warning in the shape every store reports.
    fn warning(&self) -> ConfigWarning {
        let again = "and the retry runs the operation a second time";
        match self {
            Self::SynchronousCommitOff => ConfigWarning::new(
                "synchronous_commit is off",
                "a claim is acknowledged before it is flushed, and a server crash can lose it, so \
                 the retry runs the operation a second time",
                "set synchronous_commit = on",
            ),
            Self::SynchronousCommitLocal { replicas } => ConfigWarning::new(
                format!("synchronous_commit is local with {replicas} replica(s)"),
                format!(
                    "commits do not wait for the synchronous standby, so a failover can lose an \
                     acknowledged claim {again}"
                ),
                "set synchronous_commit = on (or remote_apply)",
            ),
            Self::AsynchronousReplicas { replicas } => ConfigWarning::new(
                format!(
                    "{replicas} replica(s) stream asynchronously (synchronous_standby_names is empty)"
                ),
                format!(
                    "a failover can promote a standby that never received an acknowledged claim, \
                     {again}"
                ),
                "name the standby in synchronous_standby_names",
            ),
            Self::NoSynchronousStandby { names } => ConfigWarning::new(
                format!(
                    "synchronous_standby_names is {names:?} but no connected standby is synchronous"
                ),
                "every commit waits until one connects",
                "connect a standby it names, or change synchronous_standby_names",
            ),
            Self::FsyncOff => ConfigWarning::new(
                "fsync is off",
                "a crash of the server's machine can lose or corrupt committed claims",
                "set fsync = on",
            ),
            Self::InRecovery => ConfigWarning::new(
                "the server is a standby in recovery",
                "it refuses every write",
                "point the store at the primary",
            ),
        }
    }
}

/// What can lose a claim on a server with these settings.
fn judge(server: &ServerConfig) -> Vec<DurabilityWarning> {
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
    warnings
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
    pub(crate) async fn durability_warnings(&self) -> Result<Vec<ConfigWarning>, StoreError> {
        let (row, replicas) = retry_conflicts(&self.mode, "config check", || async {
            let mut c = self.pool.acquire().await?;
            let row = self
                .statement(&SqlStr::from_static(
                    "SELECT current_setting('synchronous_commit'), \
                     current_setting('synchronous_standby_names'), current_setting('fsync'), \
                     pg_is_in_recovery()",
                ))
                .fetch_one(&mut *c)
                .await?;
            let replicas = self
                .statement(&SqlStr::from_static(
                    "SELECT coalesce(sync_state, '') FROM pg_stat_replication",
                ))
                .fetch_all(&mut *c)
                .await?;
            Ok((row, replicas))
        })
        .await?;
        let replicas = replicas
            .into_iter()
            .map(|r| Replica {
                sync_state: r.get(0),
            })
            .collect();
        let fsync: String = row.get(2);
        let server = ServerConfig {
            synchronous_commit: row.get(0),
            synchronous_standby_names: row.get(1),
            fsync: fsync == "on",
            in_recovery: row.get(3),
            replicas,
        };
        Ok(judge(&server)
            .iter()
            .map(DurabilityWarning::warning)
            .collect())
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
                    sync_state: (*s).into(),
                })
                .collect(),
        }
    }

    fn judge(s: ServerConfig) -> Vec<DurabilityWarning> {
        super::judge(&s)
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
