use super::*;

fn cp(name: &str, value: &str, at: u64) -> Checkpoint {
    Checkpoint::new(name, value, Timestamp::from_millis(at)).unwrap()
}

fn record() -> Record {
    Record {
        scope: Scope::new("tenant").unwrap(),
        key: IdempotencyKey::new("k-1").unwrap(),
        fingerprint: Fingerprint::parse(&"ab".repeat(32)).unwrap(),
        state: RecordState::Completed,
        token: Token::with_id(3, 0xfeed),
        attempt: 2,
        lease_until: Timestamp::from_millis(1_000),
        outcome: Some(
            Outcome::from_json_text(201, "{ \"b\":1, \"a\":2 }", OutcomeClass::Definitive).unwrap(),
        ),
        created_at: Timestamp::from_millis(10),
        updated_at: Timestamp::from_millis(20),
        expires_at: Timestamp::from_millis(30),
        checkpoints: vec![
            Checkpoint::new("charged", "{\"id\": 1}", Timestamp::from_millis(15)).unwrap(),
        ],
    }
}

fn message(err: StoreError) -> String {
    assert_eq!(err.kind(), "corrupt", "{err:?}");
    err.to_string()
}

#[test]
fn columns_round_trip() {
    let r = record();
    assert_eq!(RawRecord::from_record(&r).into_record().unwrap(), r);
    let bare = Record {
        outcome: None,
        state: RecordState::Processing,
        ..record()
    };
    let raw = RawRecord::from_record(&bare);
    assert_eq!(raw.outcome_status, None);
    assert_eq!(raw.into_record().unwrap(), bare);
}

#[test]
fn timestamps_clamp_at_the_far_end() {
    let far = Record {
        expires_at: Timestamp::from_millis(u64::MAX),
        lease_until: Timestamp::from_millis(u64::MAX - 1),
        ..record()
    };
    let raw = RawRecord::from_record(&far);
    assert_eq!((raw.expires_at, raw.lease_until), (i64::MAX, i64::MAX));
    let back = raw.into_record().unwrap();
    assert_eq!(back.expires_at, Timestamp::from_millis(u64::MAX));
    assert_eq!(back.lease_until, Timestamp::from_millis(u64::MAX));
    assert_eq!(
        timestamp_from_column("x", 7).unwrap(),
        Timestamp::from_millis(7)
    );
    assert!(message(timestamp_from_column("lease_until", -5).unwrap_err()).contains("lease_until"));
    assert_eq!(
        integer_from_text("x", "18446744073709551615").unwrap(),
        i64::MAX
    );
    assert_eq!(integer_from_text("x", "-3").unwrap(), -3);
    assert!(message(integer_from_text("lu", "soon").unwrap_err()).contains("lu"));
}

#[test]
fn every_bad_column_is_corrupt_and_named() {
    type Spoil = fn(&mut RawRecord);
    let cases: [(&str, Spoil); 16] = [
        ("scope", |r| r.scope = String::new()),
        ("key", |r| r.key = String::new()),
        ("fingerprint", |r| r.fingerprint = "ABC".into()),
        ("state", |r| r.state = "done".into()),
        ("token_seq", |r| r.token_seq = -1),
        ("token_id", |r| r.token_id = "not-hex".into()),
        ("attempt", |r| r.attempt = 5_000_000_000),
        ("attempt", |r| r.attempt = -1),
        ("lease_until", |r| r.lease_until = -5),
        ("created_at", |r| r.created_at = -1),
        ("updated_at", |r| r.updated_at = -1),
        ("expires_at", |r| r.expires_at = -1),
        ("outcome_status", |r| r.outcome_status = Some(70_000)),
        ("outcome_class", |r| r.outcome_class = Some("maybe".into())),
        ("outcome_body", |r| {
            r.outcome_body = Some("{not json".into())
        }),
        ("checkpoints", |r| r.checkpoints = Some("[{".into())),
    ];
    for (column, spoil) in cases {
        let mut raw = RawRecord::from_record(&record());
        spoil(&mut raw);
        let msg = message(raw.into_record().unwrap_err());
        assert!(msg.contains(column), "{column}: {msg}");
    }
    let mut raw = RawRecord::from_record(&record());
    raw.outcome_class = None;
    assert!(message(raw.into_record().unwrap_err()).contains("partly absent"));
}

#[test]
fn corrupt_keeps_its_source() {
    let mut raw = RawRecord::from_record(&record());
    raw.outcome_body = Some("{not json".into());
    let err = raw.into_record().unwrap_err();
    assert!(std::error::Error::source(&err).is_some(), "{err:?}");
    assert!(std::error::Error::source(&StoreError::corrupt("x")).is_none());
}

#[test]
fn column_round_trips_byte_for_byte() {
    let list = vec![
        cp("charged", "{ \"b\":1, \"a\":\"é/\\u00e9\" }", 10),
        cp("émail \"sent\"", "[1, 2.50]", u64::MAX),
    ];
    let column = checkpoints_to_column(&list).unwrap();
    assert_eq!(checkpoints_from_column(Some(&column)).unwrap(), list);
    assert_eq!(checkpoints_to_column(&[]), None);
    assert!(checkpoints_from_column(None).unwrap().is_empty());
    assert!(checkpoints_from_column(Some("[]")).unwrap().is_empty());
    // Appending an item as the SQL stores do gives the same column.
    let appended = format!(
        "{},{}]",
        &checkpoints_to_column(&list[..1])
            .unwrap()
            .trim_end_matches(']'),
        checkpoint_item(&list[1])
    );
    assert_eq!(appended, column);
}

#[test]
fn bad_columns_are_corrupt() {
    for bad in [
        "{",
        "[{\"name\":\"a\",\"value\":\"not json\",\"saved_at\":1}]",
        "[{\"name\":\"a\",\"value\":\"1\",\"saved_at\":-1}]",
        "[{\"name\":\"a\",\"saved_at\":1}]",
    ] {
        let e = checkpoints_from_column(Some(bad)).unwrap_err();
        assert_eq!(e.kind(), "corrupt", "{bad}: {e:?}");
    }
}
