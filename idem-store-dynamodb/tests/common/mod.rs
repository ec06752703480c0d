//! What the tests share: the server's URL, a table of their own, the conformance factory, and a
//! client that counts the requests it sends.
#![allow(dead_code)]

use std::pin::Pin;
use std::sync::Arc;

use idem_conformance::kit::{env_url, unique};
use idem_store_dynamodb::aws_sdk_dynamodb;
use idem_store_dynamodb::{DynamoOptions, DynamoStore, TableName};

/// `IDEM_TEST_DYNAMODB_URL`: `dynamodb://TABLE?endpoint=…&region=…` of a DynamoDB-compatible
/// server (scripts/services/dynamodb.sh starts moto).
pub fn url() -> Option<String> {
    env_url(
        "IDEM_TEST_DYNAMODB_URL",
        "scripts/services/dynamodb.sh starts a local DynamoDB-compatible server (moto)",
    )
}

/// The options of `url` with the table replaced by a new one named after `prefix`.
pub fn own_table(url: &str, prefix: &str) -> DynamoOptions {
    let mut options = DynamoOptions::parse(url).expect("IDEM_TEST_DYNAMODB_URL parses");
    options.table = TableName::new(unique(prefix)).expect("a valid table name");
    options
}

/// A migrated store on a table of its own.
pub async fn fresh(url: &str, prefix: &str) -> DynamoStore {
    let store = DynamoStore::connect_with(&own_table(url, prefix))
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    store
}

/// What `conformance_tests!` builds a store with.
pub type Factory =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = DynamoStore> + Send>> + Send + Sync + 'static>;

/// The table of every store the conformance factories make in this test process: one process's
/// stores share their records (the suite opens several, as several processes would), and what
/// the cases leave behind stays out of the table `idem demo` and `idem serve` use.
static TABLE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| unique("conformance"));
static MIGRATED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

/// The conformance suite's factory: every call a new client on [`TABLE`], migrated once.
pub fn factory(url: String) -> Factory {
    Box::new(move || {
        let url = url.clone();
        Box::pin(async move {
            let mut options = DynamoOptions::parse(&url).expect("IDEM_TEST_DYNAMODB_URL parses");
            options.table = TableName::new(TABLE.as_str()).expect("a valid table name");
            let store = DynamoStore::connect_with(&options).await.expect("connect");
            MIGRATED
                .get_or_init(|| async { store.migrate().await.expect("migrate") })
                .await;
            store
        })
    })
}

/// Counts the requests (attempts included) a client sends, by operation.
#[derive(Debug, Default, Clone)]
pub struct Requests(Arc<std::sync::Mutex<Vec<String>>>);

impl Requests {
    /// The operations sent so far, in order, and forgets them.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

impl aws_sdk_dynamodb::config::Intercept for Requests {
    fn name(&self) -> &'static str {
        "RequestCounter"
    }

    fn read_before_transmit(
        &self,
        context: &aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _: &aws_sdk_dynamodb::config::RuntimeComponents,
        _: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let target = context
            .request()
            .headers()
            .get("x-amz-target")
            .unwrap_or("?")
            .trim_start_matches("DynamoDB_20120810.")
            .to_owned();
        self.0.lock().unwrap().push(target);
        Ok(())
    }
}

/// `store` again, through a client that records each request it sends in the returned
/// [`Requests`].
pub fn counted(store: &DynamoStore) -> (DynamoStore, Requests) {
    let requests = Requests::default();
    let config = store
        .client()
        .config()
        .to_builder()
        .interceptor(requests.clone())
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(config);
    (
        DynamoStore::from_client(client, store.table().clone()),
        requests,
    )
}

/// How many calls `counted` saw: shorthand for the tests' assertions.
pub fn count(requests: &Requests) -> usize {
    requests.take().len()
}
