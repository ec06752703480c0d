//! The table name, the versioned schema and the SQL text built from them.

use std::fmt;

use idem_core::StoreError;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use crate::error::{TableNameError, at};

/// The table that records which schema version each idem table is at. One row per idem table,
/// so several stores with different table names can share one database file (which
/// `PRAGMA user_version`, one number per file, could not).
pub const SCHEMA_TABLE: &str = "idem_schema_versions";

/// The schema version this crate writes and reads.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Each migration, in order; `{t}` is the quoted table name, `{n}` the bare one (for index
/// names). Append, never edit: a database at version N runs migrations N+1.. only.
const MIGRATIONS: &[&str] = &[
    // 1: the records table and the two indexes its queries need.
    r#"
    CREATE TABLE {t} (
        scope          TEXT    NOT NULL,
        key            TEXT    NOT NULL,
        fingerprint    TEXT    NOT NULL,
        state          TEXT    NOT NULL,
        token_seq      INTEGER NOT NULL,
        token_id       TEXT    NOT NULL,
        attempt        INTEGER NOT NULL,
        lease_until    INTEGER NOT NULL,
        outcome_status INTEGER,
        outcome_body   TEXT,
        outcome_class  TEXT,
        created_at     INTEGER NOT NULL,
        updated_at     INTEGER NOT NULL,
        expires_at     INTEGER NOT NULL,
        PRIMARY KEY (scope, key)
    );
    CREATE INDEX "{n}_in_flight" ON {t} (state, lease_until);
    CREATE INDEX "{n}_expires_at" ON {t} (expires_at);
    "#,
    // 2: `list` by state and by age (by scope it uses the primary key).
    r#"
    CREATE INDEX "{n}_state_updated" ON {t} (state, updated_at);
    CREATE INDEX "{n}_updated" ON {t} (updated_at);
    "#,
    // 3: fewer pages per commit. `list` without a state filter reads `(state, updated_at)` once
    // per state (see `Sql::list`), so `(updated_at)` goes; the in-flight index keeps only
    // `processing` records (what `list_in_flight` reads), ordered as it returns them, instead of
    // an entry for every record that each completion moves. Its leading `state` makes the
    // planner prefer it over `(state, updated_at)` even on a table never analysed.
    r#"
    DROP INDEX IF EXISTS "{n}_updated";
    DROP INDEX IF EXISTS "{n}_in_flight";
    CREATE INDEX "{n}_in_flight" ON {t} (state, lease_until, scope, key)
        WHERE state = 'processing';
    "#,
    // 4: the operation's checkpoints (contract §6.1), a JSON array (`idem_core::checkpoint`);
    // NULL when there are none.
    r#"
    ALTER TABLE {t} ADD COLUMN checkpoints TEXT;
    "#,
];

/// A validated table name: a plain SQL identifier, safe to splice into SQL text.
///
/// ```
/// use idem_store_sqlite::{TableName, TableNameError};
/// assert_eq!(TableName::new("idem_records").unwrap().as_str(), "idem_records");
/// assert_eq!(TableName::new(""), Err(TableNameError::Empty));
/// assert!(matches!(TableName::new("records; DROP TABLE x"), Err(TableNameError::InvalidCharacter { index: 7, .. })));
/// assert!(matches!(TableName::new("sqlite_master"), Err(TableNameError::Reserved { .. })));
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName(String);

impl TableName {
    /// The longest name accepted, in bytes (leaves room for the index names built from it).
    pub const MAX_LEN: usize = 48;

    /// The default table name, `idem_records`.
    pub const DEFAULT: &'static str = "idem_records";

    /// Validates `name` (see [`TableNameError`] for the rules).
    pub fn new(name: impl Into<String>) -> Result<Self, TableNameError> {
        let name = name.into();
        let Some(first) = name.chars().next() else {
            return Err(TableNameError::Empty);
        };
        if name.len() > Self::MAX_LEN {
            return Err(TableNameError::TooLong { len: name.len() });
        }
        if !(first.is_ascii_alphabetic() || first == '_') {
            return Err(TableNameError::BadFirstCharacter);
        }
        if let Some((index, ch)) = name
            .char_indices()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '_'))
        {
            return Err(TableNameError::InvalidCharacter { index, ch });
        }
        let lower = name.to_ascii_lowercase();
        if lower.starts_with("sqlite_") || lower == SCHEMA_TABLE {
            return Err(TableNameError::Reserved { name });
        }
        Ok(Self(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn quoted(&self) -> String {
        // Validated: no quote can occur inside.
        format!("\"{}\"", self.0)
    }
}

impl Default for TableName {
    fn default() -> Self {
        Self(Self::DEFAULT.to_owned())
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableName({})", self.0)
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for TableName {
    type Err = TableNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// The columns every read selects, in the order `row::RawRow` reads them.
pub(crate) const COLUMNS: &str = "scope, key, fingerprint, state, token_seq, token_id, attempt, \
     lease_until, outcome_status, outcome_body, outcome_class, created_at, updated_at, expires_at, \
     checkpoints";

/// The statements of one table, built once per store.
#[derive(Debug)]
pub(crate) struct Sql {
    pub select: String,
    pub insert: String,
    pub insert_new: String,
    pub update_held: String,
    pub complete: String,
    pub checkpoint: String,
    pub list_in_flight: String,
    pub purge: String,
    table: String,
}

impl Sql {
    pub(crate) fn new(table: &TableName) -> Self {
        let t = table.quoted();
        Self {
            select: format!("SELECT {COLUMNS} FROM {t} WHERE scope = ?1 AND key = ?2"),
            insert: format!(
                "INSERT INTO {t} ({COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
            ),
            // A claim of a key that was absent when read outside the write lock: inserts unless a
            // record appeared meanwhile (then the claim reads and decides again).
            insert_new: format!(
                "INSERT INTO {t} ({COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15) \
                 ON CONFLICT (scope, key) DO NOTHING"
            ),
            // machine::complete as one fenced statement: only a live `processing` record held by
            // this token (?3, ?4) is written, and only the columns a completion changes, so the
            // indexes it does not touch (primary key) are not rewritten. A completed record's
            // checkpoints end with it; a `failed_retryable` one keeps them.
            complete: format!(
                "UPDATE {t} SET state = ?6, outcome_status = ?7, outcome_body = ?8, \
                 outcome_class = ?9, updated_at = ?5, expires_at = ?10, \
                 checkpoints = CASE WHEN ?6 = 'completed' THEN NULL ELSE checkpoints END \
                 WHERE scope = ?1 AND key = ?2 AND state = 'processing' AND token_seq = ?3 \
                 AND token_id = ?4 AND expires_at > ?5"
            ),
            // machine::checkpoint as one fenced statement (fenced like `complete`): the item ?5
            // is appended to the JSON array, or starts it.
            checkpoint: format!(
                "UPDATE {t} SET updated_at = ?6, checkpoints = CASE \
                 WHEN checkpoints IS NULL OR checkpoints = '[]' THEN '[' || ?5 || ']' \
                 ELSE substr(checkpoints, 1, length(checkpoints) - 1) || ',' || ?5 || ']' END \
                 WHERE scope = ?1 AND key = ?2 AND state = 'processing' AND token_seq = ?3 \
                 AND token_id = ?4 AND expires_at > ?6"
            ),
            // Fenced in the statement itself: it writes only over the token that was read.
            update_held: format!(
                "UPDATE {t} SET fingerprint = ?3, state = ?4, token_seq = ?5, token_id = ?6, \
                 attempt = ?7, lease_until = ?8, outcome_status = ?9, outcome_body = ?10, \
                 outcome_class = ?11, created_at = ?12, updated_at = ?13, expires_at = ?14, \
                 checkpoints = ?15 \
                 WHERE scope = ?1 AND key = ?2 AND token_seq = ?16 AND token_id = ?17"
            ),
            list_in_flight: format!(
                "SELECT {COLUMNS} FROM {t} \
                 WHERE state = 'processing' AND lease_until <= ?1 AND expires_at > ?1 \
                 ORDER BY lease_until, scope, key LIMIT ?2"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE rowid IN \
                 (SELECT rowid FROM {t} WHERE expires_at <= ?1 LIMIT ?2)"
            ),
            table: t,
        }
    }

    /// The `list` query for the filters that are set, each served by an index, and its
    /// parameters. A state filter reads `(state, updated_at)` in order; a scope filter (without a
    /// state) the primary key; with neither, the query reads `(state, updated_at)` once per state,
    /// at most `limit` rows each, and merges them: the same order as one `(updated_at)` index
    /// would give, without the write cost of that index.
    pub(crate) fn list(
        &self,
        filter: &idem_core::ListFilter,
        now: idem_core::Timestamp,
        limit: i64,
    ) -> (String, Vec<rusqlite::types::Value>) {
        use idem_core::RecordState;
        use rusqlite::types::Value;
        let mut params = vec![Value::Integer(idem_core::record::timestamp_to_column(now))];
        let mut conditions = String::from("expires_at > ?1");
        let mut state_param = None;
        if let Some(state) = filter.state {
            params.push(Value::Text(state.as_str().to_owned()));
            state_param = Some(params.len());
        }
        if let Some(scope) = &filter.scope {
            params.push(Value::Text(scope.as_str().to_owned()));
            conditions.push_str(&format!(" AND scope = ?{}", params.len()));
        }
        if let Some(before) = filter.updated_before {
            params.push(Value::Integer(idem_core::record::timestamp_to_column(
                before,
            )));
            conditions.push_str(&format!(" AND updated_at <= ?{}", params.len()));
        }
        params.push(Value::Integer(limit));
        let order = format!("ORDER BY updated_at, scope, key LIMIT ?{}", params.len());
        let sql = match state_param {
            Some(n) => format!(
                "SELECT {COLUMNS} FROM {} WHERE state = ?{n} AND {conditions} {order}",
                self.table
            ),
            None if filter.scope.is_some() => {
                format!(
                    "SELECT {COLUMNS} FROM {} WHERE {conditions} {order}",
                    self.table
                )
            }
            None => {
                let per_state: Vec<String> = RecordState::ALL
                    .iter()
                    .map(|state| {
                        format!(
                            "SELECT * FROM (SELECT {COLUMNS} FROM {} WHERE state = '{}' \
                         AND {conditions} {order})",
                            self.table,
                            state.as_str()
                        )
                    })
                    .collect();
                format!(
                    "SELECT {COLUMNS} FROM ({}) {order}",
                    per_state.join(" UNION ALL ")
                )
            }
        };
        (sql, params)
    }
}

/// The schema version recorded for `table`, reading only: 0 when the table was never migrated
/// (no version table, or no row for this table).
pub(crate) fn version(conn: &Connection, table: &TableName) -> Result<i64, StoreError> {
    let has_versions: bool = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [SCHEMA_TABLE],
            |row| row.get::<_, i64>(0).map(|n| n > 0),
        )
        .map_err(at("schema version: look up"))?;
    if !has_versions {
        return Ok(0);
    }
    Ok(conn
        .query_row(
            &format!("SELECT version FROM {SCHEMA_TABLE} WHERE table_name = ?1"),
            [table.as_str()],
            |row| row.get(0),
        )
        .optional()
        .map_err(at("schema version: read"))?
        .unwrap_or(0))
}

/// Brings `table` to [`SCHEMA_VERSION`] inside one `BEGIN IMMEDIATE` transaction, so concurrent
/// migrations (threads or processes) run each step once. Returns the version found before.
pub(crate) fn migrate(conn: &Connection, table: &TableName) -> Result<i64, StoreError> {
    let tx = rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate)
        .map_err(at("migrate: begin"))?;
    tx.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} \
         (table_name TEXT PRIMARY KEY, version INTEGER NOT NULL)"
    ))
    .map_err(at("migrate: schema table"))?;
    let found: i64 = tx
        .query_row(
            &format!("SELECT version FROM {SCHEMA_TABLE} WHERE table_name = ?1"),
            [table.as_str()],
            |row| row.get(0),
        )
        .optional()
        .map_err(at("migrate: read version"))?
        .unwrap_or(0);
    if found > SCHEMA_VERSION {
        return Err(StoreError::Misconfigured {
            message: format!(
                "sqlite: table {table} is at schema version {found}, newer than this library's \
                 {SCHEMA_VERSION}; upgrade idem-store-sqlite"
            ),
        });
    }
    let (quoted, bare) = (table.quoted(), table.as_str());
    for step in &MIGRATIONS[usize::try_from(found).unwrap_or(0)..] {
        tx.execute_batch(&step.replace("{t}", &quoted).replace("{n}", bare))
            .map_err(at("migrate: apply"))?;
    }
    if found < SCHEMA_VERSION {
        tx.execute(
            &format!(
                "INSERT INTO {SCHEMA_TABLE} (table_name, version) VALUES (?1, ?2) \
                 ON CONFLICT (table_name) DO UPDATE SET version = excluded.version"
            ),
            rusqlite::params![bare, SCHEMA_VERSION],
        )
        .map_err(at("migrate: write version"))?;
    }
    tx.commit().map_err(at("migrate: commit"))?;
    if found < SCHEMA_VERSION {
        tracing::info!(
            table = bare,
            from = found,
            to = SCHEMA_VERSION,
            "idem sqlite schema migrated"
        );
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_name_rules() {
        assert!(TableName::new("_x1").is_ok());
        assert!(TableName::new("a".repeat(48)).is_ok());
        assert_eq!(
            TableName::new("a".repeat(49)),
            Err(TableNameError::TooLong { len: 49 })
        );
        assert_eq!(
            TableName::new("1abc"),
            Err(TableNameError::BadFirstCharacter)
        );
        assert_eq!(
            TableName::new("ab\"c"),
            Err(TableNameError::InvalidCharacter { index: 2, ch: '"' })
        );
        assert_eq!(
            TableName::new("tablé"),
            Err(TableNameError::InvalidCharacter { index: 4, ch: 'é' })
        );
        assert!(matches!(
            TableName::new("SQLITE_x"),
            Err(TableNameError::Reserved { .. })
        ));
        assert!(matches!(
            TableName::new(SCHEMA_TABLE),
            Err(TableNameError::Reserved { .. })
        ));
    }
}

#[cfg(test)]
mod list_plan_tests {
    use super::*;
    use idem_core::{ListFilter, RecordState, Scope, Timestamp};

    /// The plan of `query`, one line per step.
    fn plan(conn: &Connection, query: &str, params: impl rusqlite::Params) -> Vec<String> {
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {query}"))
            .unwrap();
        stmt.query_map(params, |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// Whether every step that reads the table reads it through an index (a `SCAN` of the table
    /// itself would read every record).
    fn index_served(plan: &[String]) -> bool {
        plan.iter()
            .filter(|step| step.starts_with("SCAN") || step.starts_with("SEARCH"))
            .filter(|step| !step.contains("SUBQUERY") && !step.contains("(subquery"))
            .all(|step| {
                step.contains("USING INDEX")
                    || step.contains("USING PRIMARY KEY")
                    || step.contains("USING COVERING INDEX")
                    || step.contains("USING INTEGER PRIMARY KEY")
            })
    }

    /// Every `list` filter, `list_in_flight` and the purge are served by an index: no plan scans
    /// the table bare, on an empty table never analysed and on one with rows and statistics.
    #[test]
    fn every_listed_operation_is_served_by_an_index() {
        let conn = Connection::open_in_memory().unwrap();
        let table = TableName::default();
        migrate(&conn, &table).unwrap();
        check_plans(&conn, &table);
        conn.execute_batch(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 2999) \
             INSERT INTO idem_records SELECT 's' || (i % 7), 'k' || i, 'f', \
             CASE i % 10 WHEN 0 THEN 'processing' WHEN 1 THEN 'failed_retryable' ELSE 'completed' END, \
             1, 't', 1, i, NULL, NULL, NULL, i, i, i + 100, NULL FROM n; ANALYZE;",
        )
        .unwrap();
        check_plans(&conn, &table);
    }

    /// The plans, on the table as it is (empty and never analysed, or filled and analysed).
    fn check_plans(conn: &Connection, table: &TableName) {
        let sql = Sql::new(table);
        let scope = Some(Scope::new("s").unwrap());
        let filters = [
            ListFilter::default(),
            ListFilter {
                state: Some(RecordState::Completed),
                ..Default::default()
            },
            ListFilter {
                scope: scope.clone(),
                ..Default::default()
            },
            ListFilter {
                updated_before: Some(Timestamp::from_millis(5)),
                ..Default::default()
            },
            ListFilter {
                scope: scope.clone(),
                updated_before: Some(Timestamp::from_millis(5)),
                ..Default::default()
            },
            ListFilter {
                state: Some(RecordState::Processing),
                scope,
                updated_before: Some(Timestamp::from_millis(5)),
            },
        ];
        for filter in filters {
            let (query, params) = sql.list(&filter, Timestamp::from_millis(1), 10);
            let plan = plan(conn, &query, rusqlite::params_from_iter(params));
            assert!(index_served(&plan), "{filter:?}: {plan:?}");
        }
        let in_flight = plan(conn, &sql.list_in_flight, rusqlite::params![5, 10]);
        assert!(
            index_served(&in_flight) && in_flight.iter().all(|s| !s.contains("TEMP B-TREE")),
            "list_in_flight: {in_flight:?}"
        );
        assert!(
            in_flight
                .iter()
                .any(|s| s.contains("idem_records_in_flight")),
            "{in_flight:?}"
        );
        let purge = plan(conn, &sql.purge, rusqlite::params![5, 10]);
        assert!(
            purge.iter().any(|s| s.contains("idem_records_expires_at")),
            "purge: {purge:?}"
        );
        let complete = plan(
            conn,
            &sql.complete,
            rusqlite::params!["s", "k", 1, "t", 1, "completed", 200, "{}", "definitive", 2],
        );
        assert!(index_served(&complete), "complete: {complete:?}");
        let checkpoint = plan(
            conn,
            &sql.checkpoint,
            rusqlite::params!["s", "k", 1, "t", "{}", 2],
        );
        assert!(index_served(&checkpoint), "checkpoint: {checkpoint:?}");
    }
}
