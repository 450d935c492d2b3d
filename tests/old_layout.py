"""The scripts of the key layout before issue 22, verbatim (pool/redis_pool.py and
pool/lease_store.py of main at 7717122, the last release before the per-tag keys):
what a node of the old version runs, so the upgrade tests can run one beside nodes
of the new version on the same Redis."""

# ruff: noqa: E501

_PRELUDE = """
local function incarnation()
  local server = redis.call('INFO', 'server')
  local repl = redis.call('INFO', 'replication')
  return string.match(server, 'run_id:(%w+)') .. ':' .. string.match(repl, 'master_replid:(%w+)')
end
local function ensure_clean()
  local marker = ARGV[1] .. incarnation()
  if redis.call('EXISTS', marker) == 1 then return {} end
  -- First script on this incarnation (restart, failover, restore): the lists
  -- may hold ranges popped before the data was lost. Drop them all, unread.
  local dropped = {}
  for _, tag in ipairs(redis.call('SMEMBERS', KEYS[1])) do
    local key = ARGV[2] .. tag
    for _, r in ipairs(redis.call('LRANGE', key, 0, -1)) do
      dropped[#dropped + 1] = tag .. '=' .. r
    end
    redis.call('DEL', key)
  end
  local old = redis.call('GET', KEYS[2])
  if old then redis.call('DEL', old) end
  redis.call('SET', marker, '1')
  redis.call('SET', KEYS[2], marker)
  return dropped
end
"""

_POP = (
    _PRELUDE
    + """
local dropped = ensure_clean()
local want, most, got, taken = tonumber(ARGV[3]), tonumber(ARGV[4]), 0, {}
repeat
  local range = redis.call('LPOP', KEYS[3])
  if not range then break end
  taken[#taken + 1] = range
  -- doubles: exact below 2^53, and only decides when to stop, never what is served
  local first, last = string.match(range, '(%d+)-(%d+)')
  got = got + tonumber(last) - tonumber(first) + 1
until got >= want or #taken >= most
redis.call('SADD', KEYS[5], ARGV[5])
return {dropped, taken, redis.call('LLEN', KEYS[3]), redis.call('HGET', KEYS[4], 'target_depth')}
"""
)

_PUSH = (
    _PRELUDE
    + """
local dropped = ensure_clean()
-- A preloader frozen past its lease (SIGSTOP, swap) must not push what it claimed
-- while the new holder fills the same list: its push counts only while it holds it.
if ARGV[5] ~= '' and redis.call('GET', KEYS[4]) ~= ARGV[5] then return {dropped, -1} end
redis.call('SADD', KEYS[1], ARGV[3])
local n = 0
if ARGV[4] == 'head' then
  for i = #ARGV, 6, -1 do n = redis.call('LPUSH', KEYS[3], ARGV[i]) end
else
  for i = 6, #ARGV do n = redis.call('RPUSH', KEYS[3], ARGV[i]) end
end
return {dropped, n}
"""
)

_RAISE_HWM = """
local online = 0
for _ in string.gmatch(redis.call('INFO', 'replication'), 'state=online') do online = online + 1 end
local cur = redis.call('GET', KEYS[1])
local new = ARGV[1]
if cur and (#cur > #new or (#cur == #new and cur >= new)) then return {cur, online} end
redis.call('SET', KEYS[1], new)
return {new, online}
"""

_RECORD = (
    _PRELUDE
    + """
local dropped = ensure_clean()
local base = ARGV[3] .. incarnation() .. ':'
local k = tonumber(ARGV[6])
local leases = 7 + k
-- SET NX: a record is written once; a (vanishingly unlikely) id clash fails the
-- whole lease instead of overwriting another client's record.
for i = leases, #ARGV, 5 do
  if redis.call('EXISTS', base .. ARGV[i]) == 1 then return {dropped, -1} end
end
-- The rest of the ranges cut for this lease goes back to the head of the list in
-- the script that records the lease: it is in the list (once) exactly when the
-- lease is recorded, and after ensure_clean, so a new incarnation cannot hold it twice.
if k > 0 then redis.call('SADD', KEYS[1], ARGV[5]) end
for i = 6 + k, 7, -1 do redis.call('LPUSH', ARGV[2] .. ARGV[5], ARGV[i]) end
local n = 0
for i = leases, #ARGV, 5 do
  local value = 'L ' .. ARGV[5] .. ' ' .. ARGV[i + 1] .. ' ' .. ARGV[i + 2] .. ' ' .. ARGV[i + 3]
    .. ' ' .. ARGV[i + 4]
  redis.call('SET', base .. ARGV[i], value, 'EX', ARGV[4])
  n = n + 1
end
return {dropped, n}
"""
)

_RETURN = (
    _PRELUDE
    + """
local function le(a, b)  -- a <= b for decimal strings without leading zeros
  return #a < #b or (#a == #b and a <= b)
end
local function same(a, b)  -- constant time: how long it takes says nothing of where they differ
  if #a ~= #b then return false end
  local diff = 0
  for i = 1, #a do diff = bit.bor(diff, bit.bxor(string.byte(a, i), string.byte(b, i))) end
  return diff == 0
end
local dropped = ensure_clean()
local key = ARGV[3] .. incarnation() .. ':' .. ARGV[6]
local record = redis.call('GET', key)
if not record then return {dropped, 'unknown_lease', '', ''} end
local state, tag, first, last, stop, hash =
  string.match(record, '^(%a) (%S+) (%d+) (%d+) (%d+) (%x+)')
-- The secret first: a caller without it learns nothing more (not even the tag).
-- A record without a hash (made before secrets) cannot be returned: waste, never a hole.
if not hash or not same(hash, ARGV[8]) then return {dropped, 'wrong_secret', '', ''} end
if ARGV[5] ~= '' and ARGV[5] ~= tag then return {dropped, 'wrong_tag', tag, ''} end
if state == 'R' then return {dropped, 'already_returned', tag, ''} end
local from = ARGV[7]
if not (le(first, from) and le(from, stop)) then return {dropped, 'outside_lease', tag, ''} end
-- Tombstone, not DEL: a retried return (its first answer lost) must read
-- "already returned", not "unknown". Same script as the push, so a tail can
-- reach the list at most once.
redis.call('SET', key,
  'R ' .. tag .. ' ' .. first .. ' ' .. last .. ' ' .. stop .. ' ' .. hash .. ' ' .. from,
  'EX', ARGV[4])
if from == stop then return {dropped, 'ok', tag, ''} end
local tail = from .. '-' .. last
redis.call('SADD', KEYS[1], tag)
redis.call('LPUSH', ARGV[2] .. tag, tail)
return {dropped, 'ok', tag, tail}
"""
)
