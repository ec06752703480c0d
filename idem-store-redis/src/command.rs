//! What a script call sends: the arguments as the scripts read them (see `scripts.rs`), and
//! `EVALSHA` with the script loaded again when the server's cache lost it.

use std::io::Write as _;

use idem_core::{Fingerprint, Outcome, StoreError};
use redis::{Cmd, ErrorKind, FromRedisValue, RedisWrite, Script, ServerErrorKind, ToRedisArgs};

use crate::conn::Conn;
use crate::error::classify;
use crate::keys::RecordKeys;
use crate::record::class_char;

/// A token id or nonce as the scripts keep it: 32 hex digits, written straight into the command.
#[derive(Clone, Copy)]
pub(crate) struct Hex32(pub(crate) u128);

impl ToRedisArgs for Hex32 {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let _ = write!(out.writer_for_next_arg(), "{:032x}", self.0);
    }
}

impl Hex32 {
    pub(crate) fn random() -> Self {
        Self(rand::random())
    }

    pub(crate) fn text(self) -> String {
        format!("{:032x}", self.0)
    }
}

/// An outcome as format 2 stores it behind the state and fingerprint the script puts first:
/// `<expires_at in 20 digits>status|class|body`, written straight into the command.
pub(crate) struct PackedOutcome<'a> {
    pub(crate) outcome: &'a Outcome,
    pub(crate) expires_at: u64,
}

impl ToRedisArgs for PackedOutcome<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut w = out.writer_for_next_arg();
        let _ = write!(w, "{:020}{}|", self.expires_at, self.outcome.status());
        let _ = w.write_all(&[class_char(self.outcome.class()), b'|']);
        let _ = w.write_all(self.outcome.body().as_bytes());
    }
}

/// The metadata `m` of a new record (see `scripts.rs`), which the claim script stores as it is
/// when the key is absent: `pn <fp> <tid> <tid> 1|1|<lease_until>|<now>|<expires_at>|<now>`.
pub(crate) struct NewMeta<'a> {
    pub(crate) fingerprint: &'a Fingerprint,
    pub(crate) token_id: Hex32,
    pub(crate) lease_until: u64,
    pub(crate) now: u64,
    pub(crate) expires_at: u64,
}

impl ToRedisArgs for NewMeta<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let tid = self.token_id.0;
        let _ = write!(
            out.writer_for_next_arg(),
            "pn{}{tid:032x}{tid:032x}1|1|{}|{}|{}|{}",
            self.fingerprint.as_str(),
            self.lease_until,
            self.now,
            self.expires_at,
            self.now
        );
    }
}

/// What the claim script reads only on a new claim or its general path, packed in one argument
/// (each argument costs the server on every call, replays included):
/// `<native ttl ms, empty for none>|<lease ms>|<takeover 1 or 0>`.
pub(crate) struct ClaimSettings {
    pub(crate) native_ttl: Option<u64>,
    pub(crate) lease: u64,
    pub(crate) takeover: &'static str,
}

impl ToRedisArgs for ClaimSettings {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut w = out.writer_for_next_arg();
        if let Some(ms) = self.native_ttl {
            let _ = write!(w, "{ms}");
        }
        let _ = write!(w, "|{}|{}", self.lease, self.takeover);
    }
}

/// `EVALSHA <script> 2 <record> <lease index>`, for the arguments to follow.
pub(crate) fn evalsha(script: &Script, keys: &RecordKeys) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash())
        .arg(2)
        .arg(&keys.record)
        .arg(&keys.lease_index);
    cmd
}

/// [`evalsha`] of a script that may file the record in the expiry index at `expires_at`: two
/// more keys, that slice's list and the slice registry.
pub(crate) fn evalsha_filing(script: &Script, keys: &RecordKeys, expires_at: u64) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash())
        .arg(4)
        .arg(&keys.record)
        .arg(&keys.lease_index)
        .arg(keys.slice(expires_at))
        .arg(&keys.slices);
    cmd
}

/// Runs `cmd` (an [`evalsha`] of `script`); on `NOSCRIPT` (the script cache is volatile) loads the
/// script and runs it once more.
pub(crate) async fn run<T: FromRedisValue>(
    script: &Script,
    cmd: &Cmd,
    conn: &mut Conn,
    op: &'static str,
) -> Result<T, StoreError> {
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(conn).await.map_err(|e| classify(op, e))?;
            cmd.query_async(conn).await
        }
        other => other,
    }
    .map_err(|e| classify(op, e))
}
