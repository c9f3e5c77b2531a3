-- submit: create one or more tasks and make them ready, atomically: each is queued, or handed
-- straight to an agent by a grant while nothing waits in the queue (see _handoff.lua).
-- KEYS[1] queue zset   KEYS[2] capability event feed   KEYS[3] intake stream
-- KEYS[4] deadlines zset (when to look at a task with a deadline or a no-agent timeout)
-- KEYS[5] grants list   KEYS[6] agent tokens hash   KEYS[7] capability stats hash
-- KEYS[8] granted hash (the standing grant set by agent, and '#': how many were written)
-- then for task i (0-based): KEYS[9+2i] task hash, KEYS[10+2i] idempotency key
-- ARGV[1] max queue depth     ARGV[2] aging ms                 ARGV[3] idempotency ttl ms
-- ARGV[4] feed maxlen         ARGV[5] task channel prefix      ARGV[6] capability
-- ARGV[7] no-agent timeout ms (0: off)   ARGV[8] inbox key prefix (an inbox is that plus the
-- agent id a grant names, in this capability's slot)
-- ARGV[9] the highest priority a grant for low-priority tasks only may take (cold_start_max_priority)
-- ARGV[10] wake channel
-- then for task i: 15 fields from ARGV[11+15i]: task id, local id, payload, priority, session id,
--   region, idempotency key, timeout ms, deadline ms (0: none), trace id, metadata JSON,
--   max attempts, routing JSON, intake entry id (entries taken from the intake stream are
--   acknowledged and deleted in the same step, so a crash never creates a task twice), and
--   '1' when the producer will wait for the result (then the outcome is pushed to its done list)
-- Returns {'full', depth} when the queue cannot take the batch, else for each task
-- {'new'|'dup', task id} flattened.
local c = context(KEYS[2], ARGV[4], ARGV[5], 0)
local queue = KEYS[1]
local max_depth = tonumber(ARGV[1])
local aging = tonumber(ARGV[2])
local idem_ttl = tonumber(ARGV[3])
local n = (#KEYS - 8) / 2
local nat = tonumber(ARGV[7])
local wake = ARGV[10]
local g = {grants = KEYS[5], granted = KEYS[8], tokens = KEYS[6], inbox_prefix = ARGV[8],
           low_max = tonumber(ARGV[9])}

local depth = redis.call('ZCARD', queue)
if depth + n > max_depth then
  return {'full', depth}
end
-- Tasks go straight to agents only while the queue is empty, so none passes a waiting one.
local granted = depth == 0 and redis.call('LLEN', g.grants) or 0  -- the grants standing before
local direct_ok = granted > 0

local loads = {}
local now = now_ms()
local now_s = jint(now)
local out = {}
local queued, direct = 0, 0
for i = 0, n - 1 do
  local task_key, idem_key = KEYS[9 + 2 * i], KEYS[10 + 2 * i]
  local a = 11 + 15 * i
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
    local deadline_at = '0'
    if deadline_ms > 0 then deadline_at = jint(now + deadline_ms) end
    local h = {'v', '2', 'id', task_id, 'cap', ARGV[6], 'payload', ARGV[a + 2],
               'priority', ARGV[a + 3], 'timeout_ms', ARGV[a + 7], 'deadline_at', deadline_at,
               'trace_id', ARGV[a + 9], 'max_attempts', ARGV[a + 11], 'attempt', '0',
               'fence', '0', 'created_at', now_s, 'queued_at', now_s}
    -- (empty options are left out of the record: a missing field reads as empty)
    if ARGV[a + 4] ~= '' then h[#h + 1] = 'session_id'; h[#h + 1] = ARGV[a + 4] end
    if ARGV[a + 5] ~= '' then h[#h + 1] = 'region'; h[#h + 1] = ARGV[a + 5] end
    if idem ~= '' then h[#h + 1] = 'idempotency_key'; h[#h + 1] = idem end
    if ARGV[a + 10] ~= '' then h[#h + 1] = 'metadata'; h[#h + 1] = ARGV[a + 10] end
    if ARGV[a + 12] ~= '' then h[#h + 1] = 'routing'; h[#h + 1] = ARGV[a + 12] end
    if ARGV[a + 14] == '1' then h[#h + 1] = 'd'; h[#h + 1] = '1' end
    local seq = add_event(h, c, task_id, 0, '0', false, 'queued', nil, now_s,
      '{"priority":' .. jint(priority) .. '}')
    local grant = nil
    if direct_ok and ARGV[a + 4] == '' and ARGV[a + 5] == '' and ARGV[a + 12] == '' then
      grant = next_grant(g, priority)
    end
    if grant then
      local why = grant[3] .. '|grant|' .. grant[4] .. '|'  -- (see broker/protocol/grants.py)
      -- (the record as deliver() reads it: DELIVERY_FIELDS)
      local f = {'queued', '0', seq, '0', false, task_id, deadline_at, ARGV[a + 2], ARGV[a + 7],
                 ARGV[a + 9], ARGV[a + 4], ARGV[a + 10], ARGV[a + 11]}
      deliver(c, task_key, f, h, grant[2], grant[1], local_id, now_s, why, ',"direct":true')
      local before = loads[grant[1]]
      loads[grant[1]] = {grant[5] + 1, grant[6], (before and before[3] or 0) + 1}
      direct = direct + 1
    else
      h[#h + 1] = 'state'; h[#h + 1] = 'queued'; h[#h + 1] = 'seq'; h[#h + 1] = seq
      redis.call('HSET', task_key, unpack(h))
      redis.call('ZADD', queue, queue_score(now, priority, aging,
        constrained(ARGV[a + 4], ARGV[a + 5], ARGV[a + 12], nil)), local_id)
      direct_ok = false  -- the rest of the batch queues behind this one
      queued = queued + 1
    end
    local look = tonumber(deadline_at)
    if nat > 0 and (look == 0 or now + nat < look) then look = now + nat end
    if look > 0 then redis.call('ZADD', KEYS[4], look, local_id) end
    if idem ~= '' then
      redis.call('SET', idem_key, task_id, 'PX', idem_ttl)
    end
    out[#out + 1] = 'new'
    out[#out + 1] = task_id
  end
  if entry ~= '' then
    redis.call('XACK', KEYS[3], DISPATCH_GROUP, entry)
    redis.call('XDEL', KEYS[3], entry)
  end
end
flush_feed(c)
if queued > 0 then wake_task(wake, ARGV[6]) end
if direct > 0 then
  redis.call('HINCRBY', KEYS[7], 'dispatched', direct)
  redis.call('HINCRBY', KEYS[7], 'direct', direct)
  tell_took(g, wake, ARGV[6], granted, loads)
end
return out
