//! The store's own parameters in a connection URL (`pooler`, `listen_url`, `batching`), taken out
//! before the
//! rest goes to sqlx.

use idem_core::StoreError;
use sqlx::postgres::PgConnectOptions;

/// A connection URL read by [`PostgresStore::connect`](crate::PostgresStore::connect).
#[derive(Debug)]
pub(crate) struct StoreParams {
    /// The driver's options: the URL without the store's parameters.
    pub(crate) options: PgConnectOptions,
    /// `pooler=transaction` (`Some(true)`), `session` or `none` (`Some(false)`); absent: probe.
    pub(crate) pooler: Option<bool>,
    /// `pooler=transaction` or `pooler=session`: a pooler that refuses unknown startup
    /// parameters.
    pub(crate) pooled: bool,
    /// `listen_url=…`, parsed.
    pub(crate) listen: Option<PgConnectOptions>,
    /// `batching=on` (the default) or `batching=off`.
    pub(crate) batching: bool,
}

fn misconfigured(message: String) -> StoreError {
    StoreError::Misconfigured { message }
}

/// `text` parsed by sqlx; its error names `what` but never shows the URL (it may hold a
/// password).
fn driver_options(what: &str, text: &str) -> Result<PgConnectOptions, StoreError> {
    text.parse()
        .map_err(|e| misconfigured(format!("postgres {what}: {e}")))
}

impl StoreParams {
    pub(crate) fn parse(text: &str) -> Result<Self, StoreError> {
        let mut url = url::Url::parse(text)
            .map_err(|e| misconfigured(format!("postgres connection string: {e}")))?;
        let (mut pooler, mut pooled, mut listen, mut batching) = (None, false, None, true);
        let mut rest = Vec::new();
        for (name, value) in url.query_pairs() {
            match &*name {
                "pooler" => {
                    (pooler, pooled) = match &*value {
                        "transaction" => (Some(true), true),
                        "session" => (Some(false), true),
                        "none" => (Some(false), false),
                        other => {
                            return Err(misconfigured(format!(
                                "postgres connection string: pooler={other:?}; expected \
                                 transaction, session or none (statement pooling is not \
                                 supported: migrate and complete_in need transactions)"
                            )));
                        }
                    }
                }
                "listen_url" => listen = Some(driver_options("listen_url", &value)?),
                "batching" => {
                    batching = match &*value {
                        "on" => true,
                        "off" => false,
                        other => {
                            return Err(misconfigured(format!(
                                "postgres connection string: batching={other:?}; expected on or off"
                            )));
                        }
                    }
                }
                _ => rest.push((name.into_owned(), value.into_owned())),
            }
        }
        url.set_query(None);
        if !rest.is_empty() {
            url.query_pairs_mut().extend_pairs(rest);
        }
        Ok(Self {
            options: driver_options("connection string", url.as_str())?,
            pooler,
            pooled,
            listen,
            batching,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_parameters_are_taken_out() {
        let p = StoreParams::parse(
            "postgres://app:pw@pooler:6432/app?sslmode=disable&pooler=transaction\
             &listen_url=postgres%3A%2F%2Fapp%3Apw%40db%3A5432%2Fapp&application_name=x",
        )
        .unwrap();
        assert!(p.pooler == Some(true) && p.batching);
        assert_eq!(p.options.get_port(), 6432);
        assert_eq!(p.options.get_application_name(), Some("x"));
        let listen = p.listen.unwrap();
        assert_eq!((listen.get_host(), listen.get_port()), ("db", 5432));
        let plain = StoreParams::parse("postgres://db/app?pooler=session").unwrap();
        assert!(plain.pooler == Some(false) && plain.pooled && plain.listen.is_none());
        let probed = StoreParams::parse("postgres://db/app").unwrap();
        assert!(probed.pooler.is_none() && !probed.pooled);
        assert!(
            !StoreParams::parse("postgres://db/app?batching=off")
                .unwrap()
                .batching
        );
        let err = StoreParams::parse("postgres://db/app?batching=maybe").unwrap_err();
        assert!(err.to_string().contains("batching=\"maybe\""), "{err}");
        let err = StoreParams::parse("postgres://db/app?pooler=statement").unwrap_err();
        assert!(err.to_string().contains("statement pooling"), "{err}");
        let err = StoreParams::parse("postgres://app:hunter2@db/app?pooler=x").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
}
