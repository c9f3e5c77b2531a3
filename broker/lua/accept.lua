-- accept: an agent takes tasks it read from its inbox and starts running them.
-- KEYS[1] the agent's inbox   KEYS[2] dead-letter stream   KEYS[3] capability event feed
-- KEYS[4] agent tokens hash
-- then for task i: KEYS[5+3i] task hash, KEYS[6+3i] task events, KEYS[7+3i] task done list
-- ARGV[1] agent id   ARGV[2] agent token   ARGV[3] feed maxlen   ARGV[4] channel prefix
-- ARGV[5] result ttl ms   then for task i: ARGV[6+2i] inbox entry id, ARGV[7+2i] fencing token
-- Only the delivery the task currently expects (same agent, same fence, state dispatched) may
-- start; any other entry is a stale copy and is acknowledged away without running.
-- Returns {'REFUSED'} for a bad token, else for each task 10 values: status ('ok', 'gone',
-- 'stale', 'canceled', 'expired', 'failed'), payload, attempt, timeout ms, deadline at, trace id,
-- session id, metadata, max attempts, task id.
local c = {feed = KEYS[3], feed_maxlen = tonumber(ARGV[3]), chan = ARGV[4], ttl = tonumber(ARGV[5])}
local inbox, agent = KEYS[1], ARGV[1]
if not token_ok(KEYS[4], agent, ARGV[2], c, 'accept') then return {'REFUSED'} end
local n = (#KEYS - 4) / 3
local now = now_ms()
local out = {}

local token_sha = redis.sha1hex(ARGV[2])

local function skip(status)
  out[#out + 1] = status
  for _ = 1, 9 do out[#out + 1] = '' end
end

local function ok_row(task_key)
  local r = redis.call('HMGET', task_key, 'payload', 'attempt', 'timeout_ms', 'deadline_at',
    'trace_id', 'session_id', 'metadata', 'max_attempts', 'id')
  out[#out + 1] = 'ok'
  for j = 1, 9 do out[#out + 1] = r[j] or '' end
end

-- Begin an attempt: count it, mark the task running by this process, tell the listeners.
local function start(task_key, events_key)
  redis.call('HINCRBY', task_key, 'attempt', 1)
  redis.call('HSET', task_key, 'state', 'running', 'started_at', jint(now), 'accepted_by', token_sha)
  emit(c, task_key, events_key, 'accepted', agent, now, '{}')
  ok_row(task_key)
end

for i = 0, n - 1 do
  local task_key, events_key, done_key = KEYS[5 + 3 * i], KEYS[6 + 3 * i], KEYS[7 + 3 * i]
  local entry, fence = ARGV[6 + 2 * i], ARGV[7 + 2 * i]
  local f = redis.call('HMGET', task_key, 'state', 'fence', 'agent_id', 'deadline_at',
    'accepted_by', 'attempt', 'max_attempts')
  if not f[1] then
    redis.call('XACK', inbox, 'agents', entry)
    redis.call('XDEL', inbox, entry)
    skip('gone')
  elseif f[1] == 'running' and f[2] == fence and f[3] == agent and f[5] == token_sha then
    -- Accepted already by this very process: the call was retried after its reply was lost.
    ok_row(task_key)
  elseif f[1] == 'running' and f[2] == fence and f[3] == agent then
    -- Accepted by an earlier incarnation of this agent id, which died while running it. This
    -- is a new attempt (so a task that kills its worker every time still ends in the DLQ).
    if tonumber(f[6]) >= tonumber(f[7]) then
      redis.call('XACK', inbox, 'agents', entry)
      redis.call('XDEL', inbox, entry)
      fail_task(c, task_key, events_key, done_key, KEYS[2], 'retries_exhausted',
        'the agent restarted while running the task, ' .. f[6] .. ' time(s)', agent, now)
      skip('failed')
    else
      emit(c, task_key, events_key, 'reclaimed', agent, now, '{"reason":"agent restarted"}')
      start(task_key, events_key)
    end
  elseif f[2] ~= fence or f[3] ~= agent or (f[1] ~= 'dispatched' and f[1] ~= 'canceled') then
    redis.call('XACK', inbox, 'agents', entry)
    redis.call('XDEL', inbox, entry)
    skip('stale')
  elseif f[1] == 'canceled' then
    redis.call('XACK', inbox, 'agents', entry)
    redis.call('XDEL', inbox, entry)
    skip('canceled')
  elseif (tonumber(f[4]) or 0) > 0 and now >= tonumber(f[4]) then
    redis.call('XACK', inbox, 'agents', entry)
    redis.call('XDEL', inbox, entry)
    fail_task(c, task_key, events_key, done_key, KEYS[2], 'expired',
      'deadline passed before the task started', agent, now)
    skip('expired')
  else
    start(task_key, events_key)
  end
end
return out
