//! The table, its versioned migrations, and the statements the store runs against it.
//!
//! The schema and table names are configurable, so the SQL is built once per store from checked
//! identifiers (see [`crate::InvalidIdentifier`]); every value travels as a bind parameter.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

/// The columns, in the order every `SELECT` returns them and every full-record bind sends them.
pub(crate) const COLUMNS: &str = "scope, key, fingerprint, state, token_seq, token_id, attempt, \
     lease_until, outcome_status, outcome_body, outcome_class, created_at, updated_at, expires_at, \
     checkpoints";

/// One versioned migration. `{table}` is replaced by the quoted, schema-qualified table name,
/// `{schema}` by the quoted schema name and `{name}` by the bare table name (for index and
/// constraint names).
pub(crate) struct Migration {
    pub(crate) version: i32,
    pub(crate) description: &'static str,
    pub(crate) sql: &'static str,
}

/// Every migration, oldest first. Never edit a released one: add the next version.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "records table, in-flight and expiry indexes",
        sql: r#"
CREATE TABLE IF NOT EXISTS {table} (
    scope          TEXT COLLATE "C" NOT NULL,
    key            TEXT COLLATE "C" NOT NULL,
    fingerprint    TEXT NOT NULL,
    state          TEXT NOT NULL,
    token_seq      BIGINT NOT NULL,
    token_id       TEXT NOT NULL,
    attempt        BIGINT NOT NULL,
    lease_until    BIGINT NOT NULL,
    outcome_status INTEGER,
    outcome_body   TEXT,
    outcome_class  TEXT,
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL,
    expires_at     BIGINT NOT NULL,
    CONSTRAINT {name}_pkey PRIMARY KEY (scope, key),
    CONSTRAINT {name}_state_check
        CHECK (state IN ('processing', 'completed', 'failed_retryable'))
);
CREATE INDEX IF NOT EXISTS {name}_in_flight_idx
    ON {table} (lease_until, scope, key) WHERE state = 'processing';
CREATE INDEX IF NOT EXISTS {name}_expires_idx ON {table} (expires_at);
"#,
    },
    Migration {
        version: 2,
        description: "indexes for list by state and by age",
        sql: r#"
CREATE INDEX IF NOT EXISTS {name}_state_updated_idx ON {table} (state, updated_at);
CREATE INDEX IF NOT EXISTS {name}_updated_idx ON {table} (updated_at);
"#,
    },
    Migration {
        version: 3,
        description: "list without a state filter reads (state, updated_at) per state; drop (updated_at)",
        // Every claim and every completion wrote an entry into each index; `list` without a
        // state filter now reads `(state, updated_at)` once per state and merges (see
        // `PostgresStore::list`), in the same order, so `(updated_at)` is written for nothing.
        sql: r#"
DROP INDEX IF EXISTS {schema}.{name}_updated_idx;
"#,
    },
    Migration {
        version: 4,
        description: "checkpoints column",
        // The operation's checkpoints (contract §6.1) as a JSON array in TEXT (never jsonb,
        // which would reorder keys: values read back byte for byte); NULL when there are none.
        // Adding a nullable column without a default rewrites no row.
        sql: r#"
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS checkpoints TEXT;
"#,
    },
    Migration {
        version: 5,
        description: "waited flag: writes notify only records a waiter marked",
        // Set by a waiter (`mark_waited`) before it reads the record; a write that ends or
        // replaces a `processing` record calls `pg_notify` only where it is set, so a deployment
        // where nobody waits takes no part in PostgreSQL's serialised commit of notifying
        // transactions. Adding a NOT NULL column with a constant default rewrites no row.
        sql: r#"
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS waited BOOLEAN NOT NULL DEFAULT false;
"#,
    },
];

/// The SQL of one store, built once from its (checked) schema and table names.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) schema_ident: String,
    pub(crate) migrations_table: String,
    pub(crate) qualified: String,
    pub(crate) table: String,
    pub(crate) insert: SqlStr,
    pub(crate) select_any: SqlStr,
    pub(crate) insert_many: SqlStr,
    pub(crate) complete_many: SqlStr,
    pub(crate) replace: SqlStr,
    pub(crate) replace_notify: SqlStr,
    pub(crate) complete: SqlStr,
    pub(crate) checkpoint: SqlStr,
    pub(crate) release: SqlStr,
    pub(crate) mark_waited: SqlStr,
    pub(crate) extend: SqlStr,
    pub(crate) get: SqlStr,
    pub(crate) list_in_flight: SqlStr,
    pub(crate) purge: SqlStr,
}

/// `update` (an `UPDATE` without `RETURNING`) as one statement that also notifies
/// [`wake::CHANNEL`](crate::wake::CHANNEL) with the payload bound at `$payload` for each row it
/// updated that a waiter marked (`waited`, which no write but `mark_waited` sets, so the value
/// returned is the one the row had); its rows affected are still the rows updated (`SELECT n`).
/// `pg_notify` is not called for an unmarked row: its transaction then commits without the
/// database-wide lock that notifying commits take one after the other.
fn notifying(update: &str, payload: usize) -> String {
    format!(
        "WITH done AS ({update} RETURNING waited) \
         SELECT CASE WHEN waited THEN pg_notify('{}', ${payload}) END FROM done",
        crate::wake::CHANNEL
    )
}

/// SQL built from checked identifiers only (values are bind parameters), which is what sqlx's
/// `AssertSqlSafe` asks a caller to vouch for. Shared, so a query takes a cheap clone.
pub(crate) fn trusted(sql: String) -> SqlStr {
    AssertSqlSafe(Arc::<str>::from(sql)).into_sql_str()
}

impl Statements {
    /// Both names must have passed `check_identifier`: they are quoted, never escaped.
    pub(crate) fn new(schema: &str, table: &str) -> Self {
        let t = format!("\"{schema}\".\"{table}\"");
        // A claim reads first (`select_any`): a replay, an in-flight or a mismatched request is
        // that one read, as cheap as any primary-key lookup (an `INSERT … ON CONFLICT DO
        // NOTHING` that conflicts costs a write statement's set-up on every replay). A key found
        // absent is inserted here, writing nothing if a concurrent claim inserted it first; the
        // claim then reads again with a new statement, whose snapshot sees that row
        // (idem_core::contract §7). A key the statement's snapshot already holds is left alone
        // before the unique check (`NOT EXISTS`): that check waits for a transaction writing the
        // row (a `complete_in` not yet committed), and a claim that inserts first under load
        // (`crate::batch`) must neither wait for it nor hold a batch of others' claims behind it.
        let insert = format!(
            "INSERT INTO {t} ({COLUMNS}) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15 \
             WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE scope = $1 AND key = $2) \
             ON CONFLICT (scope, key) DO NOTHING"
        );
        let select_any = format!("SELECT {COLUMNS} FROM {t} WHERE scope = $1 AND key = $2");
        // The inserts of a batch of claims (`crate::batch`): one array per column, in key order;
        // RETURNING names the keys inserted (a key a concurrent claim inserted first is not);
        // a key the snapshot holds is left alone without waiting, as in `insert`.
        let insert_many = format!(
            "INSERT INTO {t} ({COLUMNS}) SELECT * FROM unnest($1::text[], $2::text[], \
             $3::text[], $4::text[], $5::int8[], $6::text[], $7::int8[], $8::int8[], $9::int4[], \
             $10::text[], $11::text[], $12::int8[], $13::int8[], $14::int8[], $15::text[]) \
             AS n({COLUMNS}) \
             WHERE NOT EXISTS (SELECT 1 FROM {t} r WHERE r.scope = n.scope AND r.key = n.key) \
             ON CONFLICT (scope, key) DO NOTHING RETURNING scope, key"
        );
        // Compare-and-set: the write the machine decided, only if the record is still the one it
        // decided on: same token, state, lease and expiry, and the same checkpoints, byte for
        // byte (`$21`, the column as read). A holder's checkpoint changes none of the others,
        // and a takeover writes the checkpoints it read: one saved between the read and this
        // write would be lost, so the claim reads again instead.
        let replace = format!(
            "UPDATE {t} SET fingerprint = $3, state = $4, token_seq = $5, token_id = $6, attempt = $7, \
             lease_until = $8, outcome_status = $9, outcome_body = $10, outcome_class = $11, \
             created_at = $12, updated_at = $13, expires_at = $14, checkpoints = $15 \
             WHERE scope = $1 AND key = $2 AND token_seq = $16 AND token_id = $17 AND state = $18 \
             AND lease_until = $19 AND expires_at = $20 AND checkpoints IS NOT DISTINCT FROM $21"
        );
        // A claim that replaces a `processing` record (a takeover, or an expired one replaced)
        // changes what a waiter saw: the same compare-and-set, notifying in its statement.
        let replace_notify = notifying(&replace, 22);
        let held = "scope = $1 AND key = $2 AND state = 'processing' AND token_seq = $3 \
                    AND token_id = $4 AND expires_at > $5";
        // A completed record's checkpoints end with it; a `failed_retryable` one keeps them.
        // Completion and release notify the waiters (`crate::wake`) in the same statement, so in
        // the same transaction: a waiter wakes once the write is committed (for `complete_in`,
        // once the caller commits), and a write that changed nothing (fenced) notifies nobody.
        let complete = notifying(
            &format!(
                "UPDATE {t} SET state = $6, outcome_status = $7, outcome_body = $8, \
                 outcome_class = $9, updated_at = $5, expires_at = $10, \
                 checkpoints = CASE WHEN $6 = 'completed' THEN NULL ELSE checkpoints END \
                 WHERE {held}"
            ),
            11,
        );
        // machine::checkpoint in one fenced statement: the item $6 is appended to the JSON
        // array, or starts it.
        // A batch of completions (`crate::batch`): `complete` for each row of the arrays, one per
        // key; RETURNING names the keys completed (the others are fenced), and each notifies as
        // `complete` does, only where a waiter marked the record.
        let complete_many = format!(
            "WITH done AS (UPDATE {t} AS r SET state = v.state, outcome_status = v.status, \
             outcome_body = v.body, outcome_class = v.class, updated_at = v.now, \
             expires_at = v.expires_at, \
             checkpoints = CASE WHEN v.state = 'completed' THEN NULL ELSE r.checkpoints END \
             FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::int8[], $6::text[], \
             $7::int4[], $8::text[], $9::text[], $10::int8[], $11::text[]) \
             AS v(scope, key, token_seq, token_id, now, state, status, body, class, expires_at, \
             payload) \
             WHERE r.scope = v.scope AND r.key = v.key AND r.state = 'processing' \
             AND r.token_seq = v.token_seq AND r.token_id = v.token_id AND r.expires_at > v.now \
             RETURNING r.scope, r.key, r.waited, v.payload) \
             SELECT scope, key, CASE WHEN waited THEN pg_notify('{}', payload) END FROM done",
            crate::wake::CHANNEL
        );
        let checkpoint = format!(
            "UPDATE {t} SET updated_at = $5, checkpoints = CASE \
             WHEN checkpoints IS NULL OR checkpoints = '[]' THEN '[' || $6::text || ']' \
             ELSE left(checkpoints, -1) || ',' || $6::text || ']' END WHERE {held}"
        );
        let release = notifying(
            &format!(
                "UPDATE {t} SET state = 'failed_retryable', outcome_status = NULL, \
                 outcome_body = NULL, outcome_class = NULL, updated_at = $5 WHERE {held}"
            ),
            6,
        );
        // A waiter marks the record before it reads it (`crate::wake`). A write of the record
        // already made (or in a transaction not yet committed) holds its row lock: the mark
        // waits for that commit, and the read after it sees the write. A write after the mark
        // sees it (the row lock orders the two) and notifies. Once marked, the mark is a read.
        let mark_waited =
            format!("UPDATE {t} SET waited = true WHERE scope = $1 AND key = $2 AND NOT waited");
        // machine::extend: the later lease deadline wins (never shortened), and
        // machine::extended_expiry, with the sum done in numeric and capped at BIGINT's top
        // (timestamps saturate rather than overflow). Every right-hand side reads the row as it
        // was; RETURNING gives the deadline now stored.
        let extend = format!(
            "UPDATE {t} SET lease_until = GREATEST(lease_until, $6), updated_at = $5, \
             expires_at = GREATEST(expires_at, LEAST(GREATEST(lease_until, $6)::numeric \
             + GREATEST(expires_at - lease_until, 0), 9223372036854775807)::bigint) \
             WHERE {held} RETURNING lease_until"
        );
        let get =
            format!("SELECT {COLUMNS} FROM {t} WHERE scope = $1 AND key = $2 AND expires_at > $3");
        let list_in_flight = format!(
            "SELECT {COLUMNS} FROM {t} WHERE state = 'processing' AND lease_until <= $1 \
             AND expires_at > $1 ORDER BY lease_until, scope, key LIMIT $2"
        );
        // A bounded batch whatever the backlog: the sub-select walks the expiry index for at
        // most $2 rows and the delete fetches exactly those by ctid (a TID scan). The outer
        // expiry check is re-evaluated on the current row version, so a record a concurrent
        // claim replaced meanwhile (new version, new ctid) is left alone.
        let purge = format!(
            "DELETE FROM {t} WHERE ctid = ANY (ARRAY(SELECT ctid FROM {t} WHERE expires_at <= $1 \
             ORDER BY expires_at LIMIT $2)) AND expires_at <= $1"
        );
        Self {
            schema_ident: format!("\"{schema}\""),
            migrations_table: format!("\"{schema}\".\"{table}_migrations\""),
            qualified: t,
            table: table.to_owned(),
            insert: trusted(insert),
            select_any: trusted(select_any),
            insert_many: trusted(insert_many),
            complete_many: trusted(complete_many),
            replace: trusted(replace),
            replace_notify: trusted(replace_notify),
            complete: trusted(complete),
            checkpoint: trusted(checkpoint),
            release: trusted(release),
            mark_waited: trusted(mark_waited),
            extend: trusted(extend),
            get: trusted(get),
            list_in_flight: trusted(list_in_flight),
            purge: trusted(purge),
        }
    }

    /// A migration's SQL for this table.
    pub(crate) fn migration_sql(&self, m: &Migration) -> String {
        m.sql
            .replace("{table}", &self.qualified)
            .replace("{schema}", &self.schema_ident)
            .replace("{name}", &self.table)
    }
}
