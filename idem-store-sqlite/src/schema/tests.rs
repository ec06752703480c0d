//! The table name rules, and the plans of the `list` queries (each served by an index).

use idem_core::store::ListFilter;
use idem_core::{RecordState, Scope, Timestamp};
use rusqlite::Connection;

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
    crate::migrate::migrate_on(&conn, &table).unwrap();
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
    let sql = Statements::new(table);
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
