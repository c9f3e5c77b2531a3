-- submit: create one or more tasks and make them ready, atomically.
-- KEYS[1] queue zset   KEYS[2] capability event feed   KEYS[3] intake stream
-- KEYS[4] deadlines zset (when to look at a task with a deadline or a no-agent timeout)
-- then for task i (0-based): KEYS[5+3i] task hash, KEYS[6+3i] task events, KEYS[7+3i] idempotency key
-- ARGV[1] max queue depth     ARGV[2] aging ms                 ARGV[3] idempotency ttl ms
-- ARGV[4] feed maxlen         ARGV[5] channel prefix ("<prefix>:")   ARGV[6] capability
-- ARGV[7] no-agent timeout ms (0: off)
-- then for task i: 14 fields from ARGV[8+14i]: task id, local id, payload, priority, session id,
--   region, idempotency key, timeout ms, deadline ms (0: none), trace id, metadata JSON,
--   max attempts, routing JSON, intake entry id (entries taken from the intake stream are
--   acknowledged and deleted in the same step, so a crash never creates a task twice)
-- Returns {'FULL', depth} when the queue cannot take the batch, else for each task
-- {'new'|'dup', task id} flattened.
local c = {feed = KEYS[2], feed_maxlen = tonumber(ARGV[4]), chan = ARGV[5], ttl = 0}
local max_depth = tonumber(ARGV[1])
local aging = tonumber(ARGV[2])
local idem_ttl = tonumber(ARGV[3])
local n = (#KEYS - 4) / 3
local nat = tonumber(ARGV[7])

local depth = redis.call('ZCARD', KEYS[1])
if depth + n > max_depth then
  return {'FULL', depth}
end

local now = now_ms()
local out = {}
for i = 0, n - 1 do
  local task_key, events_key, idem_key = KEYS[5 + 3 * i], KEYS[6 + 3 * i], KEYS[7 + 3 * i]
  local a = 8 + 14 * i
  local task_id, local_id, idem = ARGV[a], ARGV[a + 1], ARGV[a + 6]
  local entry = ARGV[a + 13]
  local existing = false
  if redis.call('EXISTS', task_key) == 1 then
    existing = task_id  -- the same call retried after a lost reply: no second task
  elseif idem ~= '' then
    -- The first task with this key wins for the whole TTL, even after its record expired:
    -- running it again would break the promise the key makes.
    existing = redis.call('GET', idem_key)
  end
  if existing then
    out[#out + 1] = 'dup'
    out[#out + 1] = existing
  else
    local priority = tonumber(ARGV[a + 3])
    local deadline_ms = tonumber(ARGV[a + 8])
    local deadline_at = 0
    if deadline_ms > 0 then deadline_at = now + deadline_ms end
    redis.call('HSET', task_key,
      'v', '1', 'id', task_id, 'cap', ARGV[6], 'payload', ARGV[a + 2],
      'priority', ARGV[a + 3], 'session_id', ARGV[a + 4], 'region', ARGV[a + 5],
      'idempotency_key', idem, 'timeout_ms', ARGV[a + 7], 'deadline_at', jint(deadline_at),
      'trace_id', ARGV[a + 9], 'metadata', ARGV[a + 10], 'max_attempts', ARGV[a + 11],
      'routing', ARGV[a + 12], 'state', 'queued', 'attempt', '0', 'fence', '0',
      'created_at', jint(now), 'queued_at', jint(now), 'seq', '0')
    redis.call('ZADD', KEYS[1], now - priority * aging, local_id)
    local look = deadline_at
    if nat > 0 and (look == 0 or now + nat < look) then look = now + nat end
    if look > 0 then redis.call('ZADD', KEYS[4], look, local_id) end
    if idem ~= '' then
      redis.call('SET', idem_key, task_id, 'PX', idem_ttl)
    end
    emit(c, task_key, events_key, 'queued', nil, now, '{"priority":' .. jint(priority) .. '}')
    out[#out + 1] = 'new'
    out[#out + 1] = task_id
  end
  if entry ~= '' then
    redis.call('XACK', KEYS[3], 'dispatch', entry)
    redis.call('XDEL', KEYS[3], entry)
  end
end
redis.call('PUBLISH', ARGV[5] .. 'wake', 'task ' .. ARGV[6])
return out
