//! The table name, the versioned schema and the SQL text built from them.

use std::fmt;

use crate::error::TableNameError;

/// The table that records which schema version each idem table is at. One row per idem table,
/// so several stores with different table names can share one database file (which
/// `PRAGMA user_version`, one number per file, could not).
pub const SCHEMA_TABLE: &str = "idem_schema_versions";

/// The schema version this crate writes and reads.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Each migration, in order; `{t}` is the quoted table name, `{n}` the bare one (for index
/// names). Append, never edit: a database at version N runs migrations N+1.. only.
pub(crate) const MIGRATIONS: &[&str] = &[
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
    // per state (see `Statements::list`), so `(updated_at)` goes; the in-flight index keeps only
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

    pub(crate) fn quoted(&self) -> String {
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

/// The columns every read selects, in the order `row::read_row` reads them.
pub(crate) const COLUMNS: &str = "scope, key, fingerprint, state, token_seq, token_id, attempt, \
     lease_until, outcome_status, outcome_body, outcome_class, created_at, updated_at, expires_at, \
     checkpoints";

/// The statements of one table, built once per store.
#[derive(Debug)]
pub(crate) struct Statements {
    pub select_any: String,
    pub insert: String,
    pub replace: String,
    pub complete: String,
    pub checkpoint: String,
    pub list_in_flight: String,
    pub purge: String,
    table: String,
}

impl Statements {
    pub(crate) fn new(table: &TableName) -> Self {
        let t = table.quoted();
        Self {
            select_any: format!("SELECT {COLUMNS} FROM {t} WHERE scope = ?1 AND key = ?2"),
            // A record where none was: inserts unless a record appeared meanwhile (a claim that
            // read outside the write lock then reads and decides again; under the write lock, no
            // row is inserted and the write fails).
            insert: format!(
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
            replace: format!(
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
        filter: &idem_core::store::ListFilter,
        now: idem_core::Timestamp,
        limit: i64,
    ) -> (String, Vec<rusqlite::types::Value>) {
        use idem_core::RecordState;
        use rusqlite::types::Value;
        let mut params = vec![Value::Integer(crate::row::ts(now))];
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
            params.push(Value::Integer(crate::row::ts(before)));
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

#[cfg(test)]
mod tests;
