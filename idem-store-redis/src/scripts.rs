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
//! - Each writing call carries a nonce (a claim: its new token id) kept in the record. A call the
//!   client delivers twice (the cluster client resends a command whose connection broke) finds its
//!   own nonce and answers as the first delivery did, instead of being fenced by its own write.
//! - Reads and type checks come before the first write, so an error cannot leave half a record.
//! - The expiry index (see `keys.rs`: a list per time slice, and the bucket's registry of slices)
//!   files a record at most at its `expires_at` (purge moves what it finds live to the slice of
//!   its expiry), so a write that moves `expires_at` later (a completion, an extension, a reclaim)
//!   leaves the entry alone; only a new record, or an earlier `expires_at`, appends one. A slice
//!   is in the registry exactly while its list exists: the append that creates the list
//!   registers it, the purge that empties it removes it.
//! - Completion, release and a claim that replaces a `processing` record publish an empty message
//!   on the channel named like the record's key (`KEYS[1]`), so the requests waiting on it wake
//!   (`wake.rs`); on a cluster the sharded variant (`SPUBLISH`, Redis 7), whose channel lives in
//!   the key's slot. They publish only where a waiter marked the record (field `w`, set by
//!   `MARK_WAITED` after the waiter subscribed and before it reads), and take the mark off as
//!   they publish (`HDEL` answers whether it was there): a deployment where nobody waits
//!   publishes nothing, so nothing reaches the replication stream or a subscriber for it. An
//!   extension and a checkpoint do not publish: the record stays `processing`.
//! - A record's index entry (its member) is the tail of its key, `KEYS[1]` from `#KEYS[2] - 2`
//!   on (`<base>:r:<member>` against the lease index `<base>:lease`): it is not sent.
//!
//! Record layout (format 2, written by every script): field `m`, the metadata packed in one
//! string, field `o`, the outcome, when there is one, and field `c`, the checkpoints (a JSON
//! array, `idem_core::checkpoint`), when there are some:
//!
//! ```text
//! m = st ck fp tid n seq '|' att '|' lu '|' ca '|' ea '|' ua
//!     st: 1 char (p processing, c completed, f failed_retryable)
//!     ck: 1 char, how the claim was won (n new, e expired_replaced, r retry, t taken_over)
//!     fp: 64 hex digits; tid: 32 hex digits (token id); n: 32 hex digits (nonce of the last write)
//!     then decimal counters and milliseconds: token seq, attempt, lease_until, created_at,
//!     expires_at, updated_at (what a completion keeps first, what it replaces last)
//! o = st fp ea20 status '|' class (d definitive, r retryable) '|' body
//!     a header of 85 chars, state (c or f) and fingerprint as in m and expires_at in 20
//!     digits, so that a replay reads this one field; then the outcome
//! ```
//!
//! Outcomes written before the header (they begin with the status's digit) are read as they
//! are: such a record replays through the general path, not the hot one.
//!
//! Format 1 (earlier versions: fields `s k fp st seq tid att ck lu ca ua ea os ob oc n`) is still
//! read by every script and by the client; the first write to such a record rewrites it in
//! format 2 (its format-1 fields deleted, its native expiry kept).

use std::sync::LazyLock;

use redis::Script;

/// Helpers every script defines after its hot path (a function defined is a closure made on
/// every call: the hot paths return before).
const PRELUDE: &str = r#"
local function fmt(x)
  if x >= 18446744073709551615 then return '18446744073709551615' end
  return string.format('%.0f', x)
end
local function gc(key, ttl)
  if ttl == '' then redis.call('PERSIST', key) else redis.call('PEXPIRE', key, ttl) end
end
local function member() return string.sub(KEYS[1], #KEYS[2] - 2) end
-- Files member mb in the expiry slice list KEYS[3] (`<base>:x:<slice>`, its slice number after
-- the base, as `:lease` is three bytes longer than `:x:`), registering the slice if the append
-- created the list.
local function push(mb)
  if redis.call('RPUSH', KEYS[3], mb) == 1 then
    local slice = string.sub(KEYS[3], #KEYS[2] - 2)
    redis.call('ZADD', KEYS[4], slice, slice)
  end
end
-- The record in format 2 (its field m) as a table, or nil and why.
local function parse(m)
  local seq, att, lu, ca, ea, ua = string.match(m, '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)$', 131)
  if not ua or #m < 131 then return nil, 'metadata is malformed' end
  return {st = string.sub(m, 1, 1), ck = string.sub(m, 2, 2), fp = string.sub(m, 3, 66),
    tid = string.sub(m, 67, 98), n = string.sub(m, 99, 130), ea = ea, lu = lu, seq = seq,
    att = att, ca = ca, ua = ua}
end
-- A record in format 1 as the same table (v1 = true), nil if there is none, or nil and why.
local function load_v1(key)
  local r = redis.call('HMGET', key, 'st', 'seq', 'tid', 'ea', 'fp', 'lu', 'att', 'n', 'ck', 'ca', 'ua')
  if not r[1] then return nil end
  for i = 1, 11 do
    if not r[i] then return nil, 'a field of the record is missing' end
  end
  local states = {processing = 'p', completed = 'c', failed_retryable = 'f'}
  local kinds = {new = 'n', expired_replaced = 'e', retry = 'r', taken_over = 't'}
  return {v1 = true, st = states[r[1]] or r[1], seq = r[2], tid = r[3], ea = r[4], fp = r[5],
    lu = r[6], att = r[7], n = r[8], ck = kinds[r[9]] or r[9], ca = r[10], ua = r[11]}
end
-- The record (either format) given its field m (nil if absent), nil if there is none, or nil and why.
local function load(key, m)
  if m then return parse(m) end
  return load_v1(key)
end
-- The outcome of a format-1 record in format 2, or nil.
local function outcome_v1(key)
  local r = redis.call('HMGET', key, 'os', 'ob', 'oc')
  if not r[2] then return nil end
  local c = ({definitive = 'd', retryable = 'r'})[r[3]] or '?'
  return (r[1] or '') .. '|' .. c .. '|' .. r[2]
end
-- After a format-2 write to a format-1 record (never before: a hash left empty is deleted, and
-- its native expiry with it): its old fields go.
local function drop_v1(key, rec)
  if rec and rec.v1 then
    redis.call('HDEL', key, 's', 'k', 'fp', 'st', 'seq', 'tid', 'att', 'ck', 'lu', 'ca', 'ua', 'ea',
      'os', 'ob', 'oc', 'n')
  end
end
local function meta(st, ck, fp, tid, n, ea, lu, seq, att, ca, ua)
  return st .. ck .. fp .. tid .. n .. seq .. '|' .. att .. '|' .. lu .. '|' .. ca .. '|' .. ea .. '|' .. ua
end
"#;

/// KEYS: record, lease index (its name's length gives the member), the expiry slice list of the
/// new expires_at, the slice registry.
/// ARGV: fingerprint, now, the metadata `m` of a new record (`pn fp tid tid 1|1|lu|now|ea|now`,
/// built by the client: string building in Lua costs the server more than sending the string;
/// the token id (the nonce), the new lease_until and expires_at are read from it, not sent
/// again), and the settings `ttl|lease|takeover` in one string: the native ttl in ms (empty for
/// none), the lease in ms, takeover (`1` or `0`). The slice number of the new expires_at, needed
/// only when an append creates its list, is read from that list's name.
/// Every argument costs the server on every call, replays included (a Lua string, hashed byte by
/// byte, and a slot in `ARGV`), so what only a new claim or the general path reads travels packed.
/// Answers the outcome `o` (a bulk string: a replay), the status reply `seq|attempt|kind char`
/// (claimed), `{'in_flight', ms, stale}`, `{'mismatch'}` or `{'corrupt', why}`: the two hot
/// answers are one string each (every element of a script's answer costs the server a
/// conversion).
///
/// The hot paths read one field each: a replay only the outcome, whose header says whether it
/// may be replayed (state, fingerprint, expires_at); a new claim only that the key is absent.
/// They compare with plain finds at a position, not substrings (a substring is a new Lua string).
const CLAIM_HOT: &str = r#"
local o = redis.call('HGET', KEYS[1], 'o')
if o then
  -- A live completed record of this request replays from its outcome's header alone.
  if string.byte(o) == 99 and string.find(o, ARGV[1], 2, true) == 2
    and (tonumber(string.sub(o, 66, 85)) or 0) > tonumber(ARGV[2]) then
    return o
  end
elseif redis.call('EXISTS', KEYS[1]) == 0 then
  -- No record: a new claim (the key has no native expiry to clear).
  -- The client built the new record's metadata (ARGV[3]): no string is built here but its
  -- lease_until, the lease index's score.
  redis.call('HSET', KEYS[1], 'm', ARGV[3])
  local mb = string.sub(KEYS[1], #KEYS[2] - 2)
  if redis.call('RPUSH', KEYS[3], mb) == 1 then
    local slice = string.sub(KEYS[3], #KEYS[2] - 2)
    redis.call('ZADD', KEYS[4], slice, slice)
  end
  redis.call('ZADD', KEYS[2], string.sub(ARGV[3], 135, string.find(ARGV[3], '|', 135, true) - 1), mb)
  local b = string.find(ARGV[4], '|', 1, true)
  if b > 1 then redis.call('PEXPIRE', KEYS[1], string.sub(ARGV[4], 1, b - 1)) end
  return {ok = '1|1|n'}
end
local now = tonumber(ARGV[2])
local r = redis.call('HMGET', KEYS[1], 'm', 'o', 'st')
local m = r[1]
"#;

const CLAIM: &str = r#"
local ttl, lease, takeover = string.match(ARGV[4], '^(%d*)|(%d+)|([01])$')
if not takeover then return {'corrupt', 'the claim settings are malformed'} end
-- The new token id, lease_until and expires_at, from the new record's metadata.
local tid = string.sub(ARGV[3], 67, 98)
local lu_new, ea_new = string.match(ARGV[3], '^1|1|(%d+)|%d+|(%d+)|%d+$', 131)
-- rec: the record replaced or reclaimed, nil for none.
local function write(kind, fp, ca, newseq, att, rec)
  redis.call('HSET', KEYS[1], 'm', meta('p', kind, fp, tid, tid, ea_new, lu_new, newseq, att, ca, ARGV[2]))
  drop_v1(KEYS[1], rec)
  if r[2] then redis.call('HDEL', KEYS[1], 'o') end
  -- A record that replaces an expired one starts without its checkpoints; a retry and a
  -- takeover keep them.
  if kind == 'e' then redis.call('HDEL', KEYS[1], 'c') end
  local mb = member()
  if not rec or tonumber(ea_new) < (tonumber(rec.ea) or 0) then push(mb) end
  redis.call('ZADD', KEYS[2], lu_new, mb)
  gc(KEYS[1], ttl)
  -- Replacing a processing record (a takeover, an expired one) wakes its waiters.
  if rec and rec.st == 'p' and redis.call('HDEL', KEYS[1], 'w') == 1 then
    redis.call('PUBLISH', KEYS[1], '')
  end
  return {ok = newseq .. '|' .. att .. '|' .. kind}
end
if not m and not r[3] then return write('n', ARGV[1], ARGV[2], '1', '1', nil) end
local rec, why = load(KEYS[1], m)
if not rec then return {'corrupt', why or 'unreadable record'} end
if rec.n == tid and rec.tid == tid then
  return {ok = rec.seq .. '|' .. rec.att .. '|' .. rec.ck}
end
local ea = tonumber(rec.ea)
if not ea then return {'corrupt', 'expires_at is missing or not a number'} end
if ea <= now then return write('e', ARGV[1], ARGV[2], fmt((tonumber(rec.seq) or 0) + 1), '1', rec) end
if rec.fp ~= ARGV[1] then return {'mismatch'} end
local function reclaim(kind)
  local s, a = tonumber(rec.seq), tonumber(rec.att)
  if not s or not a then return {'corrupt', 'seq or attempt is not a number'} end
  return write(kind, rec.fp, rec.ca, fmt(s + 1), fmt(math.min(a + 1, 4294967295)), rec)
end
if rec.st == 'c' then
  local o = r[2]
  if rec.v1 then o = outcome_v1(KEYS[1]) end
  if o then return o end
  return {'in_flight', lease, '1'}
elseif rec.st == 'p' then
  local lu = tonumber(rec.lu)
  if not lu then return {'corrupt', 'lease_until is missing or not a number'} end
  if now < lu then return {'in_flight', fmt(math.max(lu - now, 1)), '0'} end
  if takeover ~= '1' then return {'in_flight', lease, '1'} end
  return reclaim('t')
elseif rec.st == 'f' then
  return reclaim('r')
end
return {'corrupt', 'unknown state'}
"#;

/// KEYS: record, lease index, the expiry slice list of the new expires_at, the slice registry.
/// ARGV: nonce, now, seq, token id, new state char, the outcome's header tail and the outcome
/// (`<expires_at in 20 digits>status|class|body`), new expires_at, native ttl ms ('' for none).
/// The slice number of the new expires_at, needed only when an append creates its list, is read
/// from that list's name.
/// Stores the outcome `o` behind its header: state char, fingerprint, then that tail.
const COMPLETE_HOT: &str = r#"
local m = redis.call('HGET', KEYS[1], 'm')
-- The holder of a live format-2 claim: splice the new state, nonce, expiry and update time in.
-- Fields are found and compared with plain finds (a pattern match costs the server several
-- times more; a substring is a new Lua string, hashed byte by byte).
if m and string.byte(m) == 112 and string.find(m, ARGV[4], 67, true) == 67
  and string.find(m, ARGV[1], 99, true) ~= 99 and string.find(m, ARGV[3] .. '|', 131, true) == 131 then
  -- after seq: attempt, lease_until, created_at (their bars a1..a3), expires_at, updated_at
  local a1 = string.find(m, '|', 132 + #ARGV[3], true)
  local a2 = a1 and string.find(m, '|', a1 + 1, true)
  local a3 = a2 and string.find(m, '|', a2 + 1, true)
  local a4 = a3 and string.find(m, '|', a3 + 1, true)
  local ea = a4 and tonumber(string.sub(m, a3 + 1, a4 - 1))
  if ea and ea > tonumber(ARGV[2]) then
    redis.call('HSET', KEYS[1], 'm', ARGV[5] .. string.sub(m, 2, 98) .. ARGV[1] .. string.sub(m, 131, a3) .. ARGV[7] .. '|' .. ARGV[2],
      'o', ARGV[5] .. string.sub(m, 3, 66) .. ARGV[6])
    local mb = string.sub(KEYS[1], #KEYS[2] - 2)
    if tonumber(ARGV[7]) < ea and redis.call('RPUSH', KEYS[3], mb) == 1 then
      local slice = string.sub(KEYS[3], #KEYS[2] - 2)
      redis.call('ZADD', KEYS[4], slice, slice)
    end
    redis.call('ZREM', KEYS[2], mb)
    if ARGV[8] == '' then redis.call('PERSIST', KEYS[1]) else redis.call('PEXPIRE', KEYS[1], ARGV[8]) end
    if redis.call('HDEL', KEYS[1], 'w') == 1 then redis.call('PUBLISH', KEYS[1], '') end
    -- A completed record's checkpoints end with it; a failed_retryable one keeps them.
    if ARGV[5] == 'c' then
      redis.call('HDEL', KEYS[1], 'c')
      return 'completed'
    end
    return 'marked_retryable'
  end
end
local now = tonumber(ARGV[2])
local r = redis.call('HMGET', KEYS[1], 'm', 'st')
"#;

const COMPLETE: &str = r#"
if not r[1] and not r[2] then return 'fenced' end
local rec = load(KEYS[1], r[1])
if not rec then return 'corrupt' end
local mine = rec.seq == ARGV[3] and rec.tid == ARGV[4]
if mine and rec.n == ARGV[1] then
  if rec.st == 'c' then return 'completed' end
  return 'marked_retryable'
end
if not (mine and rec.st == 'p' and (tonumber(rec.ea) or 0) > now) then return 'fenced' end
redis.call('HSET', KEYS[1], 'm', meta(ARGV[5], rec.ck, rec.fp, rec.tid, ARGV[1], ARGV[7], rec.lu, rec.seq, rec.att, rec.ca, ARGV[2]), 'o', ARGV[5] .. rec.fp .. ARGV[6])
drop_v1(KEYS[1], rec)
local mb = member()
if tonumber(ARGV[7]) < tonumber(rec.ea) then push(mb) end
redis.call('ZREM', KEYS[2], mb)
gc(KEYS[1], ARGV[8])
if redis.call('HDEL', KEYS[1], 'w') == 1 then redis.call('PUBLISH', KEYS[1], '') end
if ARGV[5] == 'c' then
  redis.call('HDEL', KEYS[1], 'c')
  return 'completed'
end
return 'marked_retryable'
"#;

/// KEYS: record, lease index. ARGV: nonce, now, seq, token id.
const RELEASE: &str = r#"
local now = tonumber(ARGV[2])
local r = redis.call('HMGET', KEYS[1], 'm', 'st', 'o')
if not r[1] and not r[2] then return 'fenced' end
local rec = load(KEYS[1], r[1])
if not rec then return 'corrupt' end
local mine = rec.seq == ARGV[3] and rec.tid == ARGV[4]
if mine and rec.n == ARGV[1] then return 'released' end
if not (mine and rec.st == 'p' and (tonumber(rec.ea) or 0) > now) then return 'fenced' end
redis.call('ZREM', KEYS[2], member())
redis.call('HSET', KEYS[1], 'm', meta('f', rec.ck, rec.fp, rec.tid, ARGV[1], rec.ea, rec.lu, rec.seq, rec.att, rec.ca, ARGV[2]))
drop_v1(KEYS[1], rec)
if r[3] then redis.call('HDEL', KEYS[1], 'o') end
if redis.call('HDEL', KEYS[1], 'w') == 1 then redis.call('PUBLISH', KEYS[1], '') end
return 'released'
"#;

/// KEYS: record, lease index (unused; its name gives the record's member to the helpers).
/// ARGV: nonce, now, seq, token id, the checkpoint as one element of the JSON array
/// (`idem_core::store::columns::checkpoint_item`).
/// Fenced like a completion; appends the element to field `c` (or starts it) and sets
/// updated_at. Returns `saved` or `fenced`.
const CHECKPOINT: &str = r#"
local now = tonumber(ARGV[2])
local r = redis.call('HMGET', KEYS[1], 'm', 'st', 'c')
if not r[1] and not r[2] then return 'fenced' end
local rec = load(KEYS[1], r[1])
if not rec then return 'corrupt' end
local mine = rec.seq == ARGV[3] and rec.tid == ARGV[4]
if mine and rec.n == ARGV[1] then return 'saved' end
if not (mine and rec.st == 'p' and (tonumber(rec.ea) or 0) > now) then return 'fenced' end
local c = r[3]
if c and #c > 2 then c = string.sub(c, 1, #c - 1) .. ',' .. ARGV[5] .. ']' else c = '[' .. ARGV[5] .. ']' end
redis.call('HSET', KEYS[1], 'm', meta('p', rec.ck, rec.fp, rec.tid, ARGV[1], rec.ea, rec.lu, rec.seq, rec.att, rec.ca, ARGV[2]), 'c', c)
drop_v1(KEYS[1], rec)
return 'saved'
"#;

/// KEYS: record, lease index.
/// ARGV: nonce, now, seq, token id, requested lease_until (`now + lease`), gc margin ms.
/// Returns `{'extended', lease_until stored}` or `{'fenced'}`.
const EXTEND: &str = r#"
local now = tonumber(ARGV[2])
local r = redis.call('HMGET', KEYS[1], 'm', 'st')
if not r[1] and not r[2] then return {'fenced'} end
local rec, why = load(KEYS[1], r[1])
if not rec then return {'corrupt', why or 'unreadable record'} end
local mine = rec.seq == ARGV[3] and rec.tid == ARGV[4]
if mine and rec.n == ARGV[1] then return {'extended', rec.lu} end
local ea = tonumber(rec.ea) or 0
if not (mine and rec.st == 'p' and ea > now) then return {'fenced'} end
local lu_old = tonumber(rec.lu)
if not lu_old then return {'corrupt', 'lease_until is missing or not a number'} end
-- machine::extend: the later deadline wins, a lease is never shortened.
local lu_new, lu_s = tonumber(ARGV[5]), ARGV[5]
if lu_new <= lu_old then lu_new, lu_s = lu_old, rec.lu end
-- machine::extended_expiry: at least as far past the new lease as it was past the old one.
local ea_new = math.max(ea, lu_new + math.max(ea - lu_old, 0))
local ea_s = rec.ea
if ea_new > ea then ea_s = fmt(ea_new) end
-- The expiry only moves later (ea_new >= ea): its index entry stays as it is.
redis.call('ZADD', KEYS[2], lu_s, member())
redis.call('HSET', KEYS[1], 'm', meta('p', rec.ck, rec.fp, rec.tid, ARGV[1], ea_s, lu_s, rec.seq, rec.att, rec.ca, ARGV[2]))
drop_v1(KEYS[1], rec)
local ttl = ea_new - now + tonumber(ARGV[6])
if ttl >= 9007199254740992 then gc(KEYS[1], '') else gc(KEYS[1], fmt(ttl)) end
return {'extended', lu_s}
"#;

/// KEYS: record. No ARGV.
/// A waiter's mark (`wake.rs`): sets field `w` on a `processing` record (either format), so that
/// the write that ends or replaces it publishes, then answers the whole hash (`HGETALL`), read in
/// the same step: a write before the mark is in the answer, a write after it publishes. A record
/// that is not `processing` (or absent) is not marked: the waiter sees it changed.
const MARK_WAITED: &str = r#"
local m = redis.call('HGET', KEYS[1], 'm')
if (m and string.byte(m) == 112) or (not m and redis.call('HGET', KEYS[1], 'st') == 'processing') then
  redis.call('HSET', KEYS[1], 'w', '1')
end
return redis.call('HGETALL', KEYS[1])
"#;

/// KEYS: record. ARGV: the nonce of the caller's last write.
/// Run after a write when the store waits for replicas (`WAIT` follows in the same pipeline, on
/// the same connection, on the node that owns the slot now). If the record still carries the
/// nonce, writes it again (a no-op on the data that still advances this connection's replication
/// offset past the original write, which replication keeps in order) and answers 1; otherwise 0:
/// the write is gone (a failover lost it) or a later write replaced it, and it cannot be
/// confirmed.
const CONFIRM: &str = r#"
local r = redis.call('HMGET', KEYS[1], 'm', 'n')
if r[1] then
  if string.sub(r[1], 99, 130) ~= ARGV[1] then return 0 end
  redis.call('HSET', KEYS[1], 'm', r[1])
  return 1
end
if r[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'n', ARGV[1])
return 1
"#;

fn script(body: &str) -> Script {
    hot_script("", body)
}

/// A script whose hot path `hot` runs before the helpers are defined.
pub(crate) fn hot_script(hot: &str, body: &str) -> Script {
    Script::new(&format!("{hot}{PRELUDE}{body}"))
}

/// A publishing script as a cluster runs it: `SPUBLISH`, whose channel (the record's key) lives
/// in the key's slot, so the message stays on its shard.
fn sharded(script: String) -> Script {
    Script::new(&script.replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'"))
}

/// The scripts that publish, for a standalone server or a cluster.
pub(crate) struct Publishing {
    pub(crate) claim: Script,
    pub(crate) complete: Script,
    pub(crate) release: Script,
}

static STANDALONE: LazyLock<Publishing> = LazyLock::new(|| Publishing {
    claim: hot_script(CLAIM_HOT, CLAIM),
    complete: hot_script(COMPLETE_HOT, COMPLETE),
    release: script(RELEASE),
});
static CLUSTER: LazyLock<Publishing> = LazyLock::new(|| Publishing {
    claim: sharded(format!("{CLAIM_HOT}{PRELUDE}{CLAIM}")),
    complete: sharded(format!("{COMPLETE_HOT}{PRELUDE}{COMPLETE}")),
    release: sharded(format!("{PRELUDE}{RELEASE}")),
});

/// The publishing scripts of a cluster (`true`) or a standalone server.
pub(crate) fn publishing(cluster: bool) -> &'static Publishing {
    if cluster { &CLUSTER } else { &STANDALONE }
}

pub(crate) static EXTEND_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(EXTEND));
pub(crate) static CHECKPOINT_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(CHECKPOINT));
pub(crate) static CONFIRM_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(CONFIRM));
pub(crate) static MARK_WAITED_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(MARK_WAITED));
