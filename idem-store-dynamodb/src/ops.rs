//! The requests behind each operation on one record: the claim's conditional write, the fenced
//! updates, the compare-and-set that applies any rule of [`idem_core::machine`], and the read.
//!
//! Every write draws a fresh write id (`wid`) and asks for the item as it was when its condition
//! failed (`ReturnValuesOnConditionCheckFailure=ALL_OLD`): the refusal itself says what is
//! stored (no second request), and a write the SDK sent again after a lost answer finds its own
//! write id there and knows it landed.

use std::collections::HashMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use idem_core::machine::{self, ClaimAnswer, ClaimKind, Transition};
use idem_core::{Fingerprint, Policy, Record, RecordId, RecordState, StoreError, Timestamp, Token};

use crate::error::classify;
use crate::expr::names;
use crate::item::{self, Item, Stored, n, s, ts};
use crate::schema::{self, TableName, attr};

/// How many times in a row a compare-and-set may find the record changed before the store gives
/// up with [`StoreError::Unavailable`] (each round means another writer won: progress was made).
const MAX_ROUNDS: usize = 64;

/// The condition of every fenced write: the record is live, `processing`, and holds the token.
/// Never `lease > now`: a holder whose lease elapsed and whom nobody took over still holds.
const FENCE: &str = "#tid = :tid AND #seq = :seq AND #st = :processing AND #exp > :now";

/// The client and the table: what every request needs.
pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) table: TableName,
}

/// What the claim's first write learnt.
pub(crate) enum FirstClaim {
    /// It wrote a new record (there was none, or an expired one).
    Claimed(ClaimAnswer),
    /// There is a live record: this one (`None` if it vanished in between).
    Found(Option<Stored>),
}

/// How a fenced update went.
pub(crate) enum Fenced {
    /// Written.
    Written,
    /// Not written: the record as it is (`None` when there is none).
    Refused(Option<Box<Stored>>),
}

/// A fenced update: its operation's name, the attributes it sets (without the write id, which
/// every write sets) and removes, what it adds to the fence's condition (`""` for nothing), and
/// the values they bind.
pub(crate) struct Update<'a> {
    pub(crate) op: &'static str,
    pub(crate) set: &'a str,
    pub(crate) remove: &'a str,
    pub(crate) condition: &'a str,
    pub(crate) values: HashMap<String, AttributeValue>,
}

/// The values every fenced write binds.
fn fence_values(token: Token, now: Timestamp) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (":tid".into(), s(token.id_hex())),
        (
            ":seq".into(),
            n(idem_core::store::columns::to_column(token.seq)),
        ),
        (":processing".into(), s(RecordState::Processing.as_str())),
        (":now".into(), ts(now)),
    ])
}

/// The item a refused conditional write returned, as a record.
fn refused<E>(err: &aws_sdk_dynamodb::error::SdkError<E, impl std::fmt::Debug>) -> Option<&Item>
where
    E: ConditionFailed,
{
    err.as_service_error().and_then(ConditionFailed::old_item)
}

/// The refusal of a conditional write, and the item it returned (`ALL_OLD`).
pub(crate) trait ConditionFailed {
    /// `Some(item)` (empty when there is no item) if this is a failed condition.
    fn old_item(&self) -> Option<&Item>;
}

/// An empty item: a failed condition on an absent record returns none.
static NO_ITEM: std::sync::LazyLock<Item> = std::sync::LazyLock::new(Item::new);

macro_rules! condition_failed {
    ($error:ty) => {
        impl ConditionFailed for $error {
            fn old_item(&self) -> Option<&Item> {
                match self {
                    Self::ConditionalCheckFailedException(e) => Some(e.item().unwrap_or(&NO_ITEM)),
                    _ => None,
                }
            }
        }
    };
}

condition_failed!(aws_sdk_dynamodb::operation::update_item::UpdateItemError);
condition_failed!(aws_sdk_dynamodb::operation::put_item::PutItemError);
condition_failed!(aws_sdk_dynamodb::operation::delete_item::DeleteItemError);

impl Inner {
    /// The claim's first and, for a new or expired key, only request: one conditional update
    /// that writes a fresh `processing` record if there is none or it expired at `now`, the
    /// token's `seq` continuing from the expired one (`if_not_exists(seq) + 1`, in the same
    /// write). Refused, it returns the live record.
    pub(crate) async fn claim_first(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        token_id: u128,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<FirstClaim, StoreError> {
        let pk = item::pk_of(id);
        let shard = schema::shard(&pk);
        let wid = item::write_id();
        let expires_at = now + policy.ttl();
        let update = "SET #sc = :sc, #k = :k, #fp = :fp, #st = :processing, \
                      #seq = if_not_exists(#seq, :zero) + :one, #tid = :tid, #att = :one, \
                      #lease = :lease, #cat = :now, #upd = :now, #exp = :exp, #ttl = :ttl, \
                      #gs = :gs, #gx = :gx, #wid = :wid \
                      REMOVE #ost, #obody, #ocls, #ochunks, #owid, #cps, #cpb";
        let condition = "attribute_not_exists(#pk) OR #exp <= :now";
        let values = HashMap::from([
            (":sc".into(), s(id.scope().as_str())),
            (":k".into(), s(id.key().as_str())),
            (":fp".into(), s(fingerprint.as_str())),
            (":processing".into(), s(RecordState::Processing.as_str())),
            (":zero".into(), n(0)),
            (":one".into(), n(1)),
            (":tid".into(), s(Token::with_id(0, token_id).id_hex())),
            (":lease".into(), ts(now + policy.lease())),
            (":now".into(), ts(now)),
            (":exp".into(), ts(expires_at)),
            (":ttl".into(), item::ttl(expires_at)),
            (
                ":gs".into(),
                item::state_partition(&pk, RecordState::Processing),
            ),
            (":gx".into(), s(schema::expiry_partition(shard))),
            (":wid".into(), s(wid.clone())),
        ]);
        let sent = self
            .client
            .update_item()
            .table_name(self.table.as_str())
            .key(schema::PK, s(pk))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names(&[update, condition])))
            .set_expression_attribute_values(Some(values))
            .return_values(ReturnValue::UpdatedNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let seq = match sent {
            Ok(out) => {
                let written = out.attributes.unwrap_or_default();
                item::number(&written, attr::SEQ)?
            }
            Err(err) => {
                let Some(old) = refused(&err) else {
                    return Err(classify("claim", self.table.as_str(), err));
                };
                let found = self.returned(Some(old)).await?;
                match found {
                    // The SDK sent it again after a lost answer: the first one landed.
                    Some(mine) if mine.write_id == wid => {
                        i64::try_from(mine.record.token.seq).unwrap_or(i64::MAX)
                    }
                    found => return Ok(FirstClaim::Found(found)),
                }
            }
        };
        let seq = idem_core::store::columns::integer_from_column(attr::SEQ, seq)?;
        Ok(FirstClaim::Claimed(ClaimAnswer::Claimed {
            token: Token::with_id(seq, token_id),
            attempt: 1,
            kind: if seq == 1 {
                ClaimKind::New
            } else {
                ClaimKind::ExpiredReplaced
            },
        }))
    }

    /// Applies `rule` to the record as stored (`found`, as last read) and writes what it says
    /// with a compare-and-set on the write id: if another write came first, the refusal returns
    /// the record as it is now and the rule decides again on it.
    pub(crate) async fn rewrite<A>(
        &self,
        op: &'static str,
        mut found: Option<Stored>,
        mut rule: impl FnMut(Option<&Record>) -> Result<Transition<A>, StoreError>,
    ) -> Result<A, StoreError> {
        for _ in 0..MAX_ROUNDS {
            let t = rule(found.as_ref().map(|f| &f.record))?;
            let Some(write) = t.write else {
                return Ok(t.answer);
            };
            let wid = item::write_id();
            let (condition, values) = match &found {
                None => ("attribute_not_exists(#pk)", None),
                Some(stored) => (
                    "#wid = :wid",
                    Some(HashMap::from([(":wid".into(), s(stored.write_id.clone()))])),
                ),
            };
            let sent = self
                .client
                .put_item()
                .table_name(self.table.as_str())
                .set_item(Some(item::to_item(&write, &wid)))
                .condition_expression(condition)
                .set_expression_attribute_names(Some(names(&[condition])))
                .set_expression_attribute_values(values)
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            match sent {
                Ok(_) => return Ok(t.answer),
                Err(err) => {
                    let Some(old) = refused(&err) else {
                        return Err(classify(op, self.table.as_str(), err));
                    };
                    found = self.returned(Some(old)).await?;
                    if found.as_ref().is_some_and(|f| f.write_id == wid) {
                        return Ok(t.answer);
                    }
                }
            }
        }
        Err(StoreError::Unavailable {
            message: format!(
                "dynamodb {op}: the record changed {MAX_ROUNDS} times in a row under this write; try again"
            ),
            source: None,
        })
    }

    /// `update` on the record `id` if the holder of `token` holds it at `now` ([`FENCE`]);
    /// refused, the record as it is.
    pub(crate) async fn fenced(
        &self,
        id: &RecordId,
        token: Token,
        now: Timestamp,
        update: Update<'_>,
    ) -> Result<Fenced, StoreError> {
        let wid = item::write_id();
        let mut set = format!("SET {}, #wid = :wid", update.set);
        if !update.remove.is_empty() {
            set.push_str(" REMOVE ");
            set.push_str(update.remove);
        }
        let condition = format!("{FENCE}{}", update.condition);
        let mut values = fence_values(token, now);
        values.extend(update.values);
        values.insert(":wid".into(), s(wid.clone()));
        let sent = self
            .client
            .update_item()
            .table_name(self.table.as_str())
            .key(schema::PK, s(item::pk_of(id)))
            .update_expression(&set)
            .condition_expression(&condition)
            .set_expression_attribute_names(Some(names(&[&set, &condition])))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match sent {
            Ok(_) => Ok(Fenced::Written),
            Err(err) => {
                let Some(old) = refused(&err) else {
                    return Err(classify(update.op, self.table.as_str(), err));
                };
                match self.returned(Some(old)).await? {
                    Some(mine) if mine.write_id == wid => Ok(Fenced::Written),
                    found => Ok(Fenced::Refused(found.map(Box::new))),
                }
            }
        }
    }

    /// The record `id` as stored (expired or not), read strongly consistent.
    pub(crate) async fn read(&self, id: &RecordId) -> Result<Option<Stored>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(self.table.as_str())
            .key(schema::PK, s(item::pk_of(id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify("get", self.table.as_str(), e))?;
        self.returned(out.item.as_ref()).await
    }

    /// Deletes the record `pk` if it has expired at `now`; whether it did.
    pub(crate) async fn delete_expired(
        &self,
        pk: String,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let condition = "#exp <= :now";
        let sent = self
            .client
            .delete_item()
            .table_name(self.table.as_str())
            .key(schema::PK, s(pk))
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names(&[condition])))
            .expression_attribute_values(":now", ts(now))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(true),
            // Claimed again since the index was read, or already gone: not deleted.
            Err(err) if refused(&err).is_some() => Ok(false),
            Err(err) => Err(classify("purge", self.table.as_str(), err)),
        }
    }
}

/// The claim rule on a record, for [`Inner::rewrite`].
pub(crate) fn claim_rule(
    req: machine::ClaimRequest<'_>,
    now: Timestamp,
    policy: &Policy,
) -> impl FnMut(Option<&Record>) -> Result<Transition<ClaimAnswer>, StoreError> {
    move |found| Ok(machine::claim(found, req, now, policy))
}
