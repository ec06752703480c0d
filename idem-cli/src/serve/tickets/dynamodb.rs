//! Tickets in a DynamoDB table of their own next to the records' (`{table}-tickets`), found by
//! the reconciler's probe.

use idem_core::reconcile::{Finding, Probe};
use idem_core::{Attempt, Outcome, OutcomeClass, StoreError};
use idemkit::dynamodb::aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, Put,
    ScalarAttributeType, Select, TransactWriteItem,
};
use idemkit::dynamodb::{DynamoStore, aws_sdk_dynamodb::Client};

use super::{Answer, BoxError, Created, NewTicket, Tickets};

/// Tickets in their own table: a counter item for ids, one item per ticket under its tenant
/// (`t#TENANT`, sorted by id, so duplicates show), and the ticket of each (scope, key) for the
/// probe (`of#SCOPE\nKEY`). They cannot commit with the record: the ticket is written, then the
/// layer completes the record; a holder that dies in between leaves a `processing` record that
/// the reconciler settles by looking the ticket up.
pub(super) struct DynamoTickets {
    client: Client,
    table: String,
}

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

impl DynamoTickets {
    /// The tickets of `store`, in the table beside its records'.
    pub(super) fn new(store: &DynamoStore) -> Self {
        Self {
            client: store.client().clone(),
            table: format!("{}-tickets", store.table()),
        }
    }

    async fn next_id(&self) -> Result<i64, BoxError> {
        let out = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s("#seq"))
            .key("sk", s("#seq"))
            .update_expression("ADD n :one")
            .expression_attribute_values(":one", AttributeValue::N("1".into()))
            .return_values(idemkit::dynamodb::aws_sdk_dynamodb::types::ReturnValue::UpdatedNew)
            .send()
            .await?;
        match out.attributes().and_then(|a| a.get("n")) {
            Some(AttributeValue::N(n)) => Ok(n.parse()?),
            _ => Err("dynamodb: the ticket counter has no number".into()),
        }
    }

    fn ticket_put(&self, id: i64, key: &str, ticket: &NewTicket) -> TransactWriteItem {
        let put = Put::builder()
            .table_name(&self.table)
            .item("pk", s(format!("t#{}", ticket.tenant)))
            .item("sk", s(format!("{id:012}")))
            .item("key", s(key))
            .item("title", s(&ticket.title))
            .item("account_id", s(&ticket.account_id))
            .item("created_at", s(&ticket.created_at))
            .build()
            .expect("table and item are set");
        TransactWriteItem::builder().put(put).build()
    }

    async fn keys(&self, tenant: &str) -> Result<Vec<String>, BoxError> {
        let mut pages = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", s(format!("t#{tenant}")))
            .consistent_read(true)
            .into_paginator()
            .items()
            .send();
        let mut keys = Vec::new();
        while let Some(item) = pages.next().await {
            if let Some(AttributeValue::S(k)) = item?.get("key") {
                keys.push(k.clone());
            }
        }
        Ok(keys)
    }
}

fn ticket_of(scope: &idem_core::Scope, key: &str) -> String {
    format!("of#{}\n{key}", scope.as_str())
}

#[idem_core::async_trait]
impl Tickets for DynamoTickets {
    async fn create_table(&self) -> Result<(), BoxError> {
        let key = |name: &str, kind: KeyType| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kind)
                .build()
        };
        let attribute = |name: &str| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()
        };
        let created = self
            .client
            .create_table()
            .table_name(&self.table)
            .billing_mode(BillingMode::PayPerRequest)
            .key_schema(key("pk", KeyType::Hash)?)
            .key_schema(key("sk", KeyType::Range)?)
            .attribute_definitions(attribute("pk")?)
            .attribute_definitions(attribute("sk")?)
            .send()
            .await;
        match created {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|e| e.is_resource_in_use_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn count(&self, tenant: &str) -> Result<i64, BoxError> {
        let mut pages = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", s(format!("t#{tenant}")))
            .select(Select::Count)
            .consistent_read(true)
            .into_paginator()
            .send();
        let mut count = 0;
        while let Some(page) = pages.next().await {
            count += i64::from(page?.count());
        }
        Ok(count)
    }

    async fn double_effects(&self, tenant: &str) -> Result<i64, BoxError> {
        let mut counts = std::collections::HashMap::new();
        for key in self.keys(tenant).await? {
            *counts.entry(key).or_insert(0) += 1;
        }
        Ok(counts.values().filter(|n| **n > 1).count() as i64)
    }

    async fn insert(&self, key: &str, ticket: &NewTicket) -> Result<i64, BoxError> {
        let id = self.next_id().await?;
        self.client
            .transact_write_items()
            .transact_items(self.ticket_put(id, key, ticket))
            .send()
            .await?;
        Ok(id)
    }

    async fn create(
        &self,
        attempt: &Attempt,
        ticket: NewTicket,
        answer: Answer,
    ) -> Result<Created, StoreError> {
        let db = |e: BoxError| StoreError::unavailable("dynamodb: tickets", e);
        let id = self.next_id().await.map_err(db)?;
        let outcome = answer(&ticket, id);
        let of = Put::builder()
            .table_name(&self.table)
            .item("pk", s(ticket_of(attempt.scope(), attempt.key().as_str())))
            .item("sk", s("-"))
            .item("status", AttributeValue::N(outcome.status().to_string()))
            .item("body", s(outcome.body()))
            .build()
            .expect("table and item are set");
        // The ticket and the probe's entry together.
        self.client
            .transact_write_items()
            .transact_items(self.ticket_put(id, attempt.key().as_str(), &ticket))
            .transact_items(TransactWriteItem::builder().put(of).build())
            .send()
            .await
            .map_err(|e| db(e.into()))?;
        // Not recorded: the layer completes the record after this answer.
        Ok(Created::Ticket {
            id,
            outcome,
            recorded: false,
        })
    }

    fn probe(&self) -> Option<Box<dyn Probe>> {
        Some(Box::new(DynamoTicketProbe {
            client: self.client.clone(),
            table: self.table.clone(),
        }))
    }
}

/// The reconciler's probe on a DynamoDB backend: is there a ticket for this (scope, key)?
struct DynamoTicketProbe {
    client: Client,
    table: String,
}

#[idem_core::async_trait]
impl Probe for DynamoTicketProbe {
    async fn probe(&self, record: &idem_core::Record) -> Finding {
        let found = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(ticket_of(&record.scope, record.key.as_str())))
            .key("sk", s("-"))
            .consistent_read(true)
            .send()
            .await;
        let item = match found {
            Ok(out) => out.item,
            Err(_) => return Finding::Unknown,
        };
        let Some(item) = item else {
            return Finding::NotHappened;
        };
        let outcome = match (item.get("status"), item.get("body")) {
            (Some(AttributeValue::N(status)), Some(AttributeValue::S(body))) => status
                .parse()
                .ok()
                .and_then(|st| Outcome::from_json_text(st, body, OutcomeClass::Definitive).ok()),
            _ => None,
        };
        outcome.map_or(Finding::Unknown, Finding::Happened)
    }
}
