//! What a `dynamodb://TABLE?region=…&endpoint=…` URL says, and the SDK client built from it with
//! the SDK's own configuration chain.

use std::fmt;

use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::Client;
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use idem_core::StoreError;

use crate::error::TableNameError;
use crate::schema::TableName;

/// A `dynamodb://` URL that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// Not a URL, or not `dynamodb://`.
    #[error("not a dynamodb:// URL (dynamodb://TABLE?region=…&endpoint=…): {reason}")]
    NotDynamoDb {
        /// Why.
        reason: String,
    },
    /// The table name (the URL's host part) is not one DynamoDB accepts.
    #[error("dynamodb:// URL: table name: {0}")]
    Table(#[from] TableNameError),
    /// A query parameter the store does not know, or one given twice.
    #[error("dynamodb:// URL: parameter {name:?} is unknown or repeated (known: region, endpoint)")]
    Parameter {
        /// The parameter's name.
        name: String,
    },
    /// `endpoint=` is not an `http://` or `https://` URL.
    #[error("dynamodb:// URL: endpoint {endpoint:?} is not an http:// or https:// URL")]
    Endpoint {
        /// The value given.
        endpoint: String,
    },
}

/// Where the store's table is: its name, and the region and endpoint when they are not left to
/// the SDK's configuration chain (`AWS_REGION`, the profile, the Lambda environment).
///
/// ```
/// use idem_store_dynamodb::DynamoOptions;
/// let o = DynamoOptions::parse("dynamodb://idem?region=eu-west-1&endpoint=http://127.0.0.1:8000")?;
/// assert_eq!(o.table.as_str(), "idem");
/// assert_eq!(o.region.as_deref(), Some("eu-west-1"));
/// assert_eq!(o.endpoint.as_deref(), Some("http://127.0.0.1:8000"));
/// assert!(DynamoOptions::parse("dynamodb://idem?regoin=eu-west-1").is_err());
/// # Ok::<(), idem_store_dynamodb::UrlError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DynamoOptions {
    /// The table.
    pub table: TableName,
    /// The region (`?region=`); `None` leaves it to the SDK's chain.
    pub region: Option<String>,
    /// Another endpoint than the region's (`?endpoint=`), e.g. a local server.
    pub endpoint: Option<String>,
}

impl DynamoOptions {
    /// The table `table`, with the region and the endpoint left to the SDK.
    pub fn new(table: TableName) -> Self {
        Self {
            table,
            region: None,
            endpoint: None,
        }
    }

    /// Reads `dynamodb://TABLE[?region=REGION][&endpoint=URL]` (the endpoint percent-encoded
    /// where it has `&` or `?`).
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let parsed = url::Url::parse(url).map_err(|e| UrlError::NotDynamoDb {
            reason: e.to_string(),
        })?;
        if parsed.scheme() != "dynamodb" {
            return Err(UrlError::NotDynamoDb {
                reason: format!("the scheme is {:?}", parsed.scheme()),
            });
        }
        if !parsed.username().is_empty()
            || parsed.password().is_some()
            || parsed.port().is_some()
            || !matches!(parsed.path(), "" | "/")
        {
            return Err(UrlError::NotDynamoDb {
                reason: "the URL names a table only: no user, port or path (credentials come \
                         from the SDK's configuration chain)"
                    .into(),
            });
        }
        // The host part as written: `url` lower-cases hosts, table names are case-sensitive.
        let table = url["dynamodb://".len()..]
            .split(['/', '?', '#'])
            .next()
            .unwrap_or_default();
        let mut options = Self::new(TableName::new(table)?);
        for (name, value) in parsed.query_pairs() {
            let slot = match &*name {
                "region" => Some(&mut options.region),
                "endpoint" => Some(&mut options.endpoint),
                _ => None,
            }
            .filter(|slot| slot.is_none())
            .ok_or_else(|| UrlError::Parameter {
                name: name.clone().into_owned(),
            })?;
            *slot = Some(value.into_owned());
        }
        if let Some(endpoint) = &options.endpoint {
            let ok = url::Url::parse(endpoint)
                .is_ok_and(|e| matches!(e.scheme(), "http" | "https") && e.host().is_some());
            if !ok {
                return Err(UrlError::Endpoint {
                    endpoint: endpoint.clone(),
                });
            }
        }
        Ok(options)
    }

    /// An SDK client: the SDK's configuration chain (credentials from the environment, the
    /// profile, web identity, the container or instance role; the region likewise), with this
    /// region and endpoint where given, over the SDK's hyper client on rustls (ring).
    pub(crate) async fn client(&self) -> Result<Client, StoreError> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest()).http_client(
            aws_smithy_http_client::Builder::new()
                .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
                .build_https(),
        );
        if let Some(region) = &self.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(endpoint) = &self.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        let config = loader.load().await;
        if config.region().is_none() {
            return Err(StoreError::Misconfigured {
                message: format!(
                    "dynamodb: no region for table {}: add ?region=… to the URL or set AWS_REGION",
                    self.table
                ),
            });
        }
        Ok(Client::new(&config))
    }
}

/// The endpoint without any user-info (never printed).
pub(crate) fn shown_endpoint(endpoint: &str) -> String {
    match url::Url::parse(endpoint) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.to_string()
        }
        Err(_) => "(unparsable)".into(),
    }
}

impl fmt::Debug for DynamoOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoOptions")
            .field("table", &self.table)
            .field("region", &self.region)
            .field("endpoint", &self.endpoint.as_deref().map(shown_endpoint))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let o = DynamoOptions::parse("dynamodb://My.Table_1").unwrap();
        assert_eq!(
            (o.table.as_str(), o.region, o.endpoint),
            ("My.Table_1", None, None)
        );
        assert!(matches!(
            DynamoOptions::parse("dynamodb://ab"),
            Err(UrlError::Table(TableNameError::Length { len: 2 }))
        ));
        assert!(matches!(
            DynamoOptions::parse("redis://x"),
            Err(UrlError::NotDynamoDb { .. })
        ));
        assert!(matches!(
            DynamoOptions::parse("dynamodb://user:pw@tbl"),
            Err(UrlError::NotDynamoDb { .. })
        ));
        assert!(matches!(
            DynamoOptions::parse("dynamodb://tbl?region=a&region=b"),
            Err(UrlError::Parameter { .. })
        ));
        assert!(matches!(
            DynamoOptions::parse("dynamodb://tbl?endpoint=localhost:8000"),
            Err(UrlError::Endpoint { .. })
        ));
    }

    #[test]
    fn debug_never_shows_user_info() {
        let o = DynamoOptions {
            endpoint: Some("https://me:SECRET@ddb.local/?X-Amz-Security-Token=SECRET".into()),
            ..DynamoOptions::new(TableName::default())
        };
        let shown = format!("{o:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("ddb.local"), "{shown}");
    }
}
