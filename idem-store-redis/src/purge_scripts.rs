//! The purge scripts (see `scripts.rs` for the conventions and the record layout).

use std::sync::LazyLock;

use redis::Script;

use crate::scripts::hot_script;

/// The `expires_at` of the record at `key` (either format) as a string, nil if there is none.
const EXPIRES_AT: &str = r#"
local function expires_at(key)
  local r = redis.call('HMGET', key, 'm', 'ea')
  if r[1] then return string.match(r[1], '^%d+|%d+|%d+|%d+|(%d+)|', 131) or '0' end
  return r[2]
end
"#;

/// KEYS: the earlier versions' expiry index, lease index, then the candidate records (all in
/// one bucket).
/// ARGV: now, then each candidate's index member, in the order of its record in KEYS.
/// Deletes the candidates expired at `now`, drops index entries whose record is gone (native
/// garbage collection got there first), and re-scores an entry whose record is live. Returns how
/// many records it deleted.
const PURGE: &str = r#"
local now = tonumber(ARGV[1])
local deleted = 0
for i = 3, #KEYS do
  local m = ARGV[i - 1]
  local ea = expires_at(KEYS[i])
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

/// KEYS: an expiry slice list, the slice registry, the lease index.
/// ARGV: now, at most how many entries to take, at most how many records to delete, the slice
/// number of KEYS[1], the bucket's record prefix (`<base>:r:`), its slice prefix (`<base>:x:`).
/// Takes entries from the head of the list: deletes the records expired at `now` (and their
/// lease entries), drops entries whose record is gone (native garbage collection got there
/// first), and appends the entry of a live record to the slice of its expiry (the same list, at
/// its tail, when that is this slice: the caller takes at most the length it read, so an entry
/// is looked at once per purge). Unregisters the slice once its list is empty. The records and
/// other slices it names are not in KEYS: they share the bucket's hash tag, so its slot.
/// Returns `{deleted, taken}`.
const PURGE_SLICE: &str = r#"
local now, take, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local deleted, taken = 0, 0
while taken < take and deleted < most do
  local m = redis.call('LPOP', KEYS[1])
  if not m then break end
  taken = taken + 1
  local key = ARGV[5] .. m
  local ea = expires_at(key)
  if not ea then
    redis.call('ZREM', KEYS[3], m)
  elseif (tonumber(ea) or 0) <= now then
    redis.call('ZREM', KEYS[3], m)
    redis.call('DEL', key)
    deleted = deleted + 1
  else
    local slice = fmt(math.floor(tonumber(ea) / 65536))
    if redis.call('RPUSH', ARGV[6] .. slice, m) == 1 then redis.call('ZADD', KEYS[2], slice, slice) end
  end
end
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('ZREM', KEYS[2], ARGV[4]) end
return {deleted, taken}
"#;

pub(crate) static PURGE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| hot_script("", &format!("{EXPIRES_AT}{PURGE}")));
pub(crate) static PURGE_SLICE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| hot_script("", &format!("{EXPIRES_AT}{PURGE_SLICE}")));
