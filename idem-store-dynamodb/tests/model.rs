//! The model-based test of `idem-conformance` against the DynamoDB-compatible server named by
//! `IDEM_TEST_DYNAMODB_URL` (read at run time): random sequences of every operation compared with
//! the pure rules. Each namespace the test asks for is a new table (`idem-model-<random>`),
//! created by `migrate`. `IDEM_CONFORMANCE_MODEL_CASES` sets the number of sequences.
//!
//! Without the variable its test prints why and skips; under `CI` it fails instead.

mod common;

#[test]
fn dynamodb_store_agrees_with_the_model() {
    let Some(url) = common::url() else { return };
    let stats = idem_conformance::run_model(move || {
        let url = url.clone();
        async move { common::fresh(&url, "idem-model").await }
    });
    eprintln!("dynamodb: {stats:?}");
}
