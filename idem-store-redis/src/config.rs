//! The server settings a store depends on, read and judged (the configuration check of
//! [`Maintenance`](idem_core::Maintenance) for Redis).

use std::collections::BTreeMap;

use idem_core::{ConfigWarning, StoreError};
use redis::Value;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};

use crate::error::{classify, is_transient};
use crate::{Conn, RedisStore, WaitForReplicas};

/// The settings read from one server (one master of a cluster). A field is `None` when the
/// server did not answer it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NodeConfig {
    /// The server, as `host:port`.
    pub(crate) node: String,
    /// `maxmemory-policy`, e.g. `noeviction`.
    pub(crate) maxmemory_policy: Option<String>,
    /// `maxmemory` in bytes (0: no limit).
    pub(crate) maxmemory: Option<u64>,
    /// `appendonly`: whether the append-only file is on.
    pub(crate) appendonly: Option<bool>,
    /// `save`: the snapshot schedule; empty when snapshots are off.
    pub(crate) save: Option<String>,
    /// `connected_slaves` from `INFO replication`: the replicas streaming from this master.
    pub(crate) connected_replicas: Option<u32>,
}

/// A setting that can turn a replay into a second execution.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Warning {
    /// `maxmemory-policy` lets the server evict keys. Every record carries a native expiry (its
    /// garbage collection), so the `volatile-*` policies can evict records too: an evicted claim
    /// or outcome is a double effect waiting to happen. Use `noeviction`.
    Eviction {
        /// The server.
        node: String,
        /// The policy it runs.
        policy: String,
        /// Its `maxmemory` (0: no limit yet, but one set later arms the policy).
        maxmemory: Option<u64>,
    },
    /// Neither the append-only file nor snapshots are on: a restart loses every record.
    NoPersistence {
        /// The server.
        node: String,
    },
    /// Only snapshots (`save`) are on: a restart loses the records written since the last one.
    SnapshotsOnly {
        /// The server.
        node: String,
        /// The snapshot schedule.
        save: String,
    },
    /// The master has replicas, which Redis feeds asynchronously, and the store does not wait
    /// for them ([`RedisStore::with_wait_for_replicas`] is off): a failover can promote a replica
    /// that never received an acknowledged claim, and the next retry runs the operation again.
    AsyncReplicas {
        /// The server.
        node: String,
        /// How many replicas it has.
        replicas: u32,
    },
    /// The store waits for more replicas than the master has: every write answers
    /// `Unavailable` until enough replicas are connected.
    TooFewReplicas {
        /// The server.
        node: String,
        /// How many replicas it has.
        replicas: u32,
        /// How many the store waits for.
        required: u32,
    },
    /// [`RedisStore::with_wait_aof`] is on but the server has no `WAITAOF` (Redis before 7.2):
    /// writes are confirmed as received by the replicas, not as written to their disks.
    NoWaitAof,
    /// The settings could not be read (`CONFIG` renamed or denied, as on some managed services).
    Unreadable {
        /// The server, or `cluster` when the cluster's masters could not all be asked.
        node: String,
        /// Why.
        reason: String,
    },
}

impl Warning {
    /// The warning in the shape every store reports.
    fn warning(&self) -> ConfigWarning {
        let again = "and the retry runs the operation a second time";
        match self {
            Self::Eviction {
                node,
                policy,
                maxmemory,
            } => ConfigWarning::new(
                format!(
                    "maxmemory-policy is {policy} on {node} (maxmemory {})",
                    maxmemory.map_or_else(|| "unknown".to_owned(), |m| m.to_string())
                ),
                "the server may evict idempotency records, and an evicted claim or outcome lets \
                 the operation run again",
                "set maxmemory-policy noeviction",
            ),
            Self::NoPersistence { node } => ConfigWarning::new(
                format!("persistence is off on {node} (appendonly no, no save schedule)"),
                "a restart loses every idempotency record",
                "set appendonly yes",
            ),
            Self::SnapshotsOnly { node, save } => ConfigWarning::new(
                format!("only snapshots persist records on {node} (save {save:?}, appendonly no)"),
                "a restart loses the records written since the last snapshot",
                "set appendonly yes",
            ),
            Self::AsyncReplicas { node, replicas } => ConfigWarning::new(
                format!(
                    "{replicas} replica(s) of {node} replicate asynchronously and the store does \
                     not WAIT for them"
                ),
                format!("a failover can lose an acknowledged claim, {again}"),
                "configure the store to wait (with_wait_for_replicas) for every replica",
            ),
            Self::TooFewReplicas {
                node,
                replicas,
                required,
            } => ConfigWarning::new(
                format!(
                    "the store waits for {required} replica(s) but only {replicas} are connected \
                     to {node}"
                ),
                "every write answers Unavailable until enough replicas are back",
                "connect the replicas, or wait for as many as each master has",
            ),
            Self::NoWaitAof => ConfigWarning::new(
                "the server has no WAITAOF (Redis before 7.2)",
                "writes are confirmed as received by the replicas, not as written to their \
                 append-only files",
                "upgrade to Redis 7.2 or later, or turn with_wait_aof off",
            ),
            Self::Unreadable { node, reason } => ConfigWarning::new(
                format!("the settings of {node} could not be read ({reason})"),
                "an eviction policy or a persistence setting that loses records goes unnoticed",
                "check maxmemory-policy and persistence by hand",
            ),
        }
    }
}

/// The settings of each server and what is unsafe in them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ConfigReport {
    /// Each server asked (each master of a cluster).
    nodes: Vec<NodeConfig>,
    /// What is unsafe, or could not be checked.
    warnings: Vec<Warning>,
}

impl ConfigReport {
    fn judge(&mut self, wait: Option<WaitForReplicas>) {
        for n in &self.nodes {
            match (n.connected_replicas, wait) {
                (Some(replicas), None) if replicas > 0 => {
                    self.warnings.push(Warning::AsyncReplicas {
                        node: n.node.clone(),
                        replicas,
                    })
                }
                (Some(replicas), Some(w)) if replicas < w.replicas() => {
                    self.warnings.push(Warning::TooFewReplicas {
                        node: n.node.clone(),
                        replicas,
                        required: w.replicas(),
                    })
                }
                _ => {}
            }
            if let Some(policy) = &n.maxmemory_policy
                && policy != "noeviction"
            {
                self.warnings.push(Warning::Eviction {
                    node: n.node.clone(),
                    policy: policy.clone(),
                    maxmemory: n.maxmemory,
                });
            }
            let save = n.save.as_deref().map(str::trim);
            match (n.appendonly, save) {
                (Some(false), Some("")) => self.warnings.push(Warning::NoPersistence {
                    node: n.node.clone(),
                }),
                (Some(false), Some(save)) => self.warnings.push(Warning::SnapshotsOnly {
                    node: n.node.clone(),
                    save: save.to_owned(),
                }),
                _ => {}
            }
        }
    }
}

/// Not a `CONFIG` parameter: `INFO replication`, asked in the same loop.
const REPLICATION: &str = "INFO replication";

const PARAMETERS: [&str; 4] = ["maxmemory-policy", "maxmemory", "appendonly", "save"];

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// The value of `param` in a `CONFIG GET param` reply (a flat array in RESP2, a map in RESP3).
fn config_value(reply: &Value, param: &str) -> Option<String> {
    let pairs: Vec<(Option<String>, Option<String>)> = match reply {
        Value::Array(items) => items
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| (text(&c[0]), text(&c[1])))
            .collect(),
        Value::Map(items) => items.iter().map(|(k, v)| (text(k), text(v))).collect(),
        _ => return None,
    };
    pairs
        .into_iter()
        .find(|(k, _)| k.as_deref() == Some(param))
        .and_then(|(_, v)| v)
}

/// `connected_slaves` in an `INFO replication` reply.
fn connected_replicas(info: &Value) -> Option<u32> {
    let text = match info {
        Value::VerbatimString { text, .. } => text.clone(),
        other => self::text(other)?,
    };
    text.lines()
        .find_map(|l| l.trim().strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
}

fn set(node: &mut NodeConfig, param: &str, value: Option<String>) {
    match param {
        "maxmemory-policy" => node.maxmemory_policy = value,
        "maxmemory" => node.maxmemory = value.and_then(|v| v.parse().ok()),
        "appendonly" => node.appendonly = value.map(|v| v == "yes"),
        _ => node.save = value,
    }
}

impl RedisStore {
    /// Reads the settings the store's guarantees depend on from the server (from every master of
    /// a cluster) and judges them; see [`Maintenance::check_config`](idem_core::Maintenance).
    pub(crate) async fn config_warnings(&self) -> Result<Vec<ConfigWarning>, StoreError> {
        Ok(self
            .config_report()
            .await?
            .warnings
            .iter()
            .map(Warning::warning)
            .collect())
    }

    async fn config_report(&self) -> Result<ConfigReport, StoreError> {
        let mut nodes: BTreeMap<String, NodeConfig> = BTreeMap::new();
        let mut report = ConfigReport::default();
        for param in PARAMETERS.into_iter().chain([REPLICATION]) {
            let mut cmd = if param == REPLICATION {
                redis::cmd("INFO")
            } else {
                redis::cmd("CONFIG")
            };
            if param == REPLICATION {
                cmd.arg("replication");
            } else {
                cmd.arg("GET").arg(param);
            }
            let replies: Result<Vec<(String, Value)>, redis::RedisError> = match &self.conn {
                Conn::Single(c) => {
                    let mut c = c.clone();
                    cmd.query_async::<Value>(&mut c)
                        .await
                        .map(|v| vec![(self.endpoints.join(","), v)])
                }
                Conn::Cluster(c) => {
                    let mut c = c.clone();
                    let routing =
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                    c.route_command(cmd.clone(), routing)
                        .await
                        .map(|v| match v {
                            Value::Map(items) => items
                                .into_iter()
                                .map(|(node, reply)| (text(&node).unwrap_or_default(), reply))
                                .collect(),
                            other => vec![("cluster".to_owned(), other)],
                        })
                }
            };
            let replies = match replies {
                Ok(replies) => replies,
                Err(e) if is_transient(&e) => return Err(classify("config check", e)),
                Err(e) => {
                    report.warnings.push(Warning::Unreadable {
                        node: if self.is_cluster() {
                            "cluster".to_owned()
                        } else {
                            self.endpoints.join(",")
                        },
                        reason: format!("{param}: {e}"),
                    });
                    return Ok(report);
                }
            };
            for (node, reply) in replies {
                let entry = nodes.entry(node.clone()).or_insert_with(|| NodeConfig {
                    node,
                    ..NodeConfig::default()
                });
                if param == REPLICATION {
                    entry.connected_replicas = connected_replicas(&reply);
                } else {
                    set(entry, param, config_value(&reply, param));
                }
            }
        }
        report.nodes = nodes.into_values().collect();
        report.judge(self.wait);
        if self.wait.is_some_and(|w| w.aof()) && !self.has_waitaof().await? {
            report.warnings.push(Warning::NoWaitAof);
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(policy: &str, aof: bool, save: &str) -> NodeConfig {
        NodeConfig {
            node: "n:1".into(),
            maxmemory_policy: Some(policy.into()),
            maxmemory: Some(0),
            appendonly: Some(aof),
            save: Some(save.into()),
            connected_replicas: Some(0),
        }
    }

    fn judge(nodes: Vec<NodeConfig>) -> Vec<Warning> {
        let mut r = ConfigReport {
            nodes,
            warnings: vec![],
        };
        r.judge(None);
        r.warnings
    }

    #[test]
    fn judgement() {
        assert!(judge(vec![node("noeviction", true, "")]).is_empty());
        assert!(matches!(
            judge(vec![node("volatile-lru", true, "")])[..],
            [Warning::Eviction { .. }]
        ));
        assert!(matches!(
            judge(vec![node("noeviction", false, "")])[..],
            [Warning::NoPersistence { .. }]
        ));
        assert!(matches!(
            judge(vec![node("allkeys-lru", false, "3600 1")])[..],
            [Warning::Eviction { .. }, Warning::SnapshotsOnly { .. }]
        ));
    }

    #[test]
    fn replicas_without_wait() {
        let mut n = node("noeviction", true, "");
        n.connected_replicas = Some(1);
        assert!(matches!(
            judge(vec![n])[..],
            [Warning::AsyncReplicas { replicas: 1, .. }]
        ));
        let info =
            Value::BulkString(b"# Replication\r\nrole:master\r\nconnected_slaves:2\r\n".to_vec());
        assert_eq!(connected_replicas(&info), Some(2));
    }

    #[test]
    fn reply_shapes() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![bulk("save"), bulk("")]);
        assert_eq!(config_value(&resp2, "save").as_deref(), Some(""));
        let resp3 = Value::Map(vec![(bulk("appendonly"), bulk("yes"))]);
        assert_eq!(config_value(&resp3, "appendonly").as_deref(), Some("yes"));
        assert_eq!(config_value(&resp3, "save"), None);
    }
}
