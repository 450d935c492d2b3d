"""The scripts of the key layout before issue 22, verbatim (pool/redis_pool.py and
pool/lease_store.py at fea03e8): what a node of the old version runs, so the
upgrade tests can run one beside nodes of the new version on the same Redis."""

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
redis.call('SADD', KEYS[1], ARGV[3])
local n = 0
if ARGV[4] == 'head' then
  for i = #ARGV, 5, -1 do n = redis.call('LPUSH', KEYS[3], ARGV[i]) end
else
  for i = 5, #ARGV do n = redis.call('RPUSH', KEYS[3], ARGV[i]) end
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
-- SET NX: a record is written once; a (vanishingly unlikely) id clash fails the
-- whole lease instead of overwriting another client's record.
for i = 6, #ARGV, 4 do
  if redis.call('EXISTS', base .. ARGV[i]) == 1 then return {dropped, -1} end
end
local n = 0
for i = 6, #ARGV, 4 do
  local value = 'L ' .. ARGV[5] .. ' ' .. ARGV[i + 1] .. ' ' .. ARGV[i + 2] .. ' ' .. ARGV[i + 3]
  redis.call('SET', base .. ARGV[i], value, 'EX', ARGV[4])
  n = n + 1
end
return {dropped, n}
"""
)
