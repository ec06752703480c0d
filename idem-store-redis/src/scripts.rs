//! The Lua scripts: one per operation, each one atomic step on the server.
//!
//! They restate the rules of [`idem_core::machine`] (a script cannot call Rust); the conformance
//! suite checks that they agree. Conventions:
//!
//! - Every key a script touches is in `KEYS[]`, and all of them share one `{hash tag}`.
//! - Time is the caller's `now` (an argument), never the server's `TIME`. Timestamps are stored as
//!   the caller's decimal strings; Lua compares them as doubles, exact below 2^53 ms (the year
//!   287 396). Token ids are only compared as strings.
//! - Native expiry is garbage collection only: `PEXPIRE` relative to `now`, with a margin.
//! - Each writing call carries a nonce (a claim: its new token id) kept in field `n`. A call the
//!   client delivers twice (the cluster client resends a command whose connection broke) finds its
//!   own nonce and answers as the first delivery did, instead of being fenced by its own write.
//! - Reads and type checks come before the first write, so an error cannot leave half a record.
//!
//! Record fields: `s` scope, `k` key, `fp` fingerprint, `st` state, `seq` and `tid` the token,
//! `att` attempt, `ck` how the claim was won, `lu` lease_until, `ca` / `ua` / `ea` created /
//! updated / expires at, `os` / `ob` / `oc` the outcome's status, body and class, `n` the nonce.

use std::sync::LazyLock;

use redis::Script;

/// Helpers every script starts with.
const PRELUDE: &str = r#"
local function fmt(x)
  if x >= 18446744073709551615 then return '18446744073709551615' end
  return string.format('%.0f', x)
end
local function gc(key, ttl)
  if ttl == '' then redis.call('PERSIST', key) else redis.call('PEXPIRE', key, ttl) end
end
"#;

/// KEYS: record, expiry index, lease index.
/// ARGV: token id (the nonce), fingerprint, now, new lease_until, new expires_at, lease ms,
/// takeover ('1' or '0'), scope, key, index member, native ttl ms ('' for none).
const CLAIM: &str = r#"
local now = tonumber(ARGV[3])
local r = redis.call('HMGET', KEYS[1], 'st', 'seq', 'tid', 'ea', 'fp', 'lu', 'att', 'os', 'ob', 'oc', 'n', 'ck')
local st, seq, ea = r[1], r[2], tonumber(r[4])
local function write(kind, newseq, att, fresh)
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[10])
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[10])
  if fresh then
    redis.call('DEL', KEYS[1])
    redis.call('HSET', KEYS[1], 's', ARGV[8], 'k', ARGV[9], 'fp', ARGV[2], 'ca', ARGV[3])
  else
    redis.call('HDEL', KEYS[1], 'os', 'ob', 'oc')
  end
  redis.call('HSET', KEYS[1], 'st', 'processing', 'seq', newseq, 'tid', ARGV[1], 'att', att,
    'ck', kind, 'lu', ARGV[4], 'ua', ARGV[3], 'ea', ARGV[5], 'n', ARGV[1])
  gc(KEYS[1], ARGV[11])
  return {'claimed', newseq, att, kind}
end
if not st then return write('new', '1', '1', true) end
if r[11] == ARGV[1] and r[3] == ARGV[1] then
  return {'claimed', seq or '', r[7] or '', r[12] or ''}
end
if not ea then return {'corrupt', 'expires_at is missing or not a number'} end
if ea <= now then return write('expired_replaced', fmt((tonumber(seq) or 0) + 1), '1', true) end
if r[5] ~= ARGV[2] then return {'mismatch'} end
local function reclaim(kind)
  local s, a = tonumber(seq), tonumber(r[7])
  if not s or not a then return {'corrupt', 'seq or attempt is not a number'} end
  return write(kind, fmt(s + 1), fmt(math.min(a + 1, 4294967295)), false)
end
if st == 'completed' then
  if r[9] then return {'replay', r[8] or '', r[9], r[10] or ''} end
  return {'in_flight', ARGV[6], '1'}
elseif st == 'processing' then
  local lu = tonumber(r[6])
  if not lu then return {'corrupt', 'lease_until is missing or not a number'} end
  if now < lu then return {'in_flight', fmt(math.max(lu - now, 1)), '0'} end
  if ARGV[7] ~= '1' then return {'in_flight', ARGV[6], '1'} end
  return reclaim('taken_over')
elseif st == 'failed_retryable' then
  return reclaim('retry')
end
return {'corrupt', 'unknown state'}
"#;

/// KEYS: record, expiry index, lease index.
/// ARGV: nonce, now, seq, token id, new state, status, body, class, new expires_at, index member,
/// native ttl ms ('' for none).
const COMPLETE: &str = r#"
local now = tonumber(ARGV[2])
local r = redis.call('HMGET', KEYS[1], 'st', 'seq', 'tid', 'ea', 'n')
local mine = r[2] == ARGV[3] and r[3] == ARGV[4]
if mine and r[5] == ARGV[1] then
  if r[1] == 'completed' then return 'completed' end
  return 'marked_retryable'
end
if not (mine and r[1] == 'processing' and (tonumber(r[4]) or 0) > now) then return 'fenced' end
redis.call('ZADD', KEYS[2], ARGV[9], ARGV[10])
redis.call('ZREM', KEYS[3], ARGV[10])
redis.call('HSET', KEYS[1], 'st', ARGV[5], 'os', ARGV[6], 'ob', ARGV[7], 'oc', ARGV[8],
  'ua', ARGV[2], 'ea', ARGV[9], 'n', ARGV[1])
gc(KEYS[1], ARGV[11])
if ARGV[5] == 'completed' then return 'completed' end
return 'marked_retryable'
"#;

/// KEYS: record, lease index. ARGV: nonce, now, seq, token id, index member.
const RELEASE: &str = r#"
local now = tonumber(ARGV[2])
local r = redis.call('HMGET', KEYS[1], 'st', 'seq', 'tid', 'ea', 'n')
local mine = r[2] == ARGV[3] and r[3] == ARGV[4]
if mine and r[5] == ARGV[1] then return 'released' end
if not (mine and r[1] == 'processing' and (tonumber(r[4]) or 0) > now) then return 'fenced' end
redis.call('ZREM', KEYS[2], ARGV[5])
redis.call('HDEL', KEYS[1], 'os', 'ob', 'oc')
redis.call('HSET', KEYS[1], 'st', 'failed_retryable', 'ua', ARGV[2], 'n', ARGV[1])
return 'released'
"#;

/// KEYS: record, expiry index, lease index.
/// ARGV: nonce, now, seq, token id, requested lease_until (`now + lease`), index member, gc
/// margin ms.
/// Returns `{'extended', lease_until stored}` or `{'fenced'}`.
const EXTEND: &str = r#"
local now = tonumber(ARGV[2])
local r = redis.call('HMGET', KEYS[1], 'st', 'seq', 'tid', 'ea', 'n', 'lu')
local mine = r[2] == ARGV[3] and r[3] == ARGV[4]
if mine and r[5] == ARGV[1] then return {'extended', r[6] or ''} end
local ea = tonumber(r[4]) or 0
if not (mine and r[1] == 'processing' and ea > now) then return {'fenced'} end
local lu_old = tonumber(r[6])
if not lu_old then return {'corrupt', 'lease_until is missing or not a number'} end
-- machine::extend: the later deadline wins, a lease is never shortened.
local lu_new, lu_s = tonumber(ARGV[5]), ARGV[5]
if lu_new <= lu_old then lu_new, lu_s = lu_old, r[6] end
-- machine::extended_expiry: at least as far past the new lease as it was past the old one.
local ea_new = math.max(ea, lu_new + math.max(ea - lu_old, 0))
local ea_s = r[4]
if ea_new > ea then ea_s = fmt(ea_new) end
redis.call('ZADD', KEYS[2], ea_s, ARGV[6])
redis.call('ZADD', KEYS[3], lu_s, ARGV[6])
redis.call('HSET', KEYS[1], 'lu', lu_s, 'ea', ea_s, 'ua', ARGV[2], 'n', ARGV[1])
local ttl = ea_new - now + tonumber(ARGV[7])
if ttl >= 9007199254740992 then gc(KEYS[1], '') else gc(KEYS[1], fmt(ttl)) end
return {'extended', lu_s}
"#;

/// KEYS: expiry index, lease index, then the candidate records (all in one bucket).
/// ARGV: now, then each candidate's index member, in the order of its record in KEYS.
/// Deletes the candidates expired at `now`, drops index entries whose record is gone (native
/// garbage collection got there first), and re-scores an entry whose record is live. Returns how
/// many records it deleted.
const PURGE: &str = r#"
local now = tonumber(ARGV[1])
local deleted = 0
for i = 3, #KEYS do
  local m = ARGV[i - 1]
  local ea = redis.call('HGET', KEYS[i], 'ea')
  if not ea then
    redis.call('ZREM', KEYS[1], m)
    redis.call('ZREM', KEYS[2], m)
  elseif (tonumber(ea) or 0) <= now then
    redis.call('ZREM', KEYS[1], m)
    redis.call('ZREM', KEYS[2], m)
    redis.call('DEL', KEYS[i])
    deleted = deleted + 1
  else
    redis.call('ZADD', KEYS[1], ea, m)
  end
end
return deleted
"#;

/// KEYS: record. ARGV: the nonce of the caller's last write.
/// Run after a write when the store waits for replicas (`WAIT` follows in the same pipeline, on
/// the same connection, on the node that owns the slot now). If the record still carries the
/// nonce, writes it again (a no-op on the data that still advances this connection's replication
/// offset past the original write, which replication keeps in order) and answers 1; otherwise 0:
/// the write is gone (a failover lost it) or a later write replaced it, and it cannot be
/// confirmed.
const CONFIRM: &str = r#"
if redis.call('HGET', KEYS[1], 'n') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'n', ARGV[1])
return 1
"#;

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}{body}"))
}

pub(crate) static CLAIM_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(CLAIM));
pub(crate) static COMPLETE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(COMPLETE));
pub(crate) static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(RELEASE));
pub(crate) static EXTEND_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(EXTEND));
pub(crate) static PURGE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(PURGE));
pub(crate) static CONFIRM_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(CONFIRM));

/// Every script, for preloading.
pub(crate) fn all() -> [&'static Script; 6] {
    [
        &CONFIRM_SCRIPT,
        &CLAIM_SCRIPT,
        &COMPLETE_SCRIPT,
        &RELEASE_SCRIPT,
        &EXTEND_SCRIPT,
        &PURGE_SCRIPT,
    ]
}
