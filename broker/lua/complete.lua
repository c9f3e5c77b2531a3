-- complete: an agent reports how its tasks ended; results are stored and inbox entries
-- acknowledged in one step, guarded by each attempt's fencing token.
-- KEYS[1] the agent's inbox   KEYS[2] delayed zset   KEYS[3] dead-letter stream
-- KEYS[4] capability event feed   KEYS[5] agent tokens hash   KEYS[6] agent health hash
-- then for task i: KEYS[7+3i] task hash, KEYS[8+3i] task events, KEYS[9+3i] task done list
-- ARGV[1] agent id   ARGV[2] agent token   ARGV[3] feed maxlen   ARGV[4] channel prefix
-- ARGV[5] result ttl ms   ARGV[6] capability   ARGV[7] latency ceiling ms (0: none)
-- then for task i, 6 values from ARGV[8+6i]: inbox entry id, fencing token, outcome
--   ('success', 'invalid_request', 'failure', 'bad_result', 'retryable_failure'),
--   body (result JSON on success, else the error text), retry backoff ms, execution ms
-- A report from a superseded attempt changes nothing but leaves a `late_result_rejected` event.
-- The agent health hash keeps, per agent, what routing needs: consecutive failures and the time
-- of the last one (circuit breaker), the last success (affinity), consecutive tasks over the
-- latency ceiling (ejection). An invalid request is the request's fault and counts for neither.
-- Returns {'REFUSED'} for a bad token, else {inbox length, inbox pending, status...} with a
-- status per task: 'ok', 'failed', 'retry', 'stale', 'canceled', 'dup', 'gone'.
local c = {feed = KEYS[4], feed_maxlen = tonumber(ARGV[3]), chan = ARGV[4], ttl = tonumber(ARGV[5])}
local inbox, agent = KEYS[1], ARGV[1]
if not token_ok(KEYS[5], agent, ARGV[2], c, 'complete') then return {'REFUSED'} end
local n = (#KEYS - 6) / 3
local health, ceiling = KEYS[6], tonumber(ARGV[7])
local now = now_ms()
local statuses = {}
local timed, timed_ms = 0, 0  -- attempts that ran to an end here, and their execution time

for i = 0, n - 1 do
  local task_key, events_key, done_key = KEYS[7 + 3 * i], KEYS[8 + 3 * i], KEYS[9 + 3 * i]
  local a = 8 + 6 * i
  local entry, fence, outcome, body = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local backoff, exec_ms = tonumber(ARGV[a + 4]), ARGV[a + 5]
  redis.call('XACK', inbox, 'agents', entry)
  redis.call('XDEL', inbox, entry)
  local f = redis.call('HMGET', task_key, 'state', 'fence', 'agent_id', 'attempt', 'max_attempts', 'id')
  local status
  if not f[1] then
    status = 'gone'
  elseif f[2] == fence and f[3] == agent and f[1] == 'canceled' then
    status = 'canceled'
  elseif f[2] == fence and f[3] == agent and f[1] ~= 'running' and f[1] ~= 'dispatched' then
    -- This very report was applied already (the call was retried after a lost reply). Every
    -- hand-over to another attempt (dispatch, reclaim) moves the fence, so this is not a late one.
    status = 'dup'
  elseif f[1] == 'dispatched' and f[2] == fence and f[3] == agent then
    -- The current attempt, whose accept was lost (a failover after the accept, before it reached
    -- the replica): count the attempt, then apply the outcome below as for a running task.
    f[4] = tostring(redis.call('HINCRBY', task_key, 'attempt', 1))
    redis.call('HSET', task_key, 'state', 'running', 'started_at', jint(now))
    f[1] = 'running'
  end
  if status then
    -- decided above
  elseif f[1] ~= 'running' or f[2] ~= fence or f[3] ~= agent then
    emit(c, task_key, events_key, 'late_result_rejected', agent, now,
      '{"fence":' .. jint(fence) .. ',"current_fence":' .. jint(f[2]) .. ',"outcome":' .. jstr(outcome) .. '}')
    status = 'stale'
  elseif outcome == 'success' then
    redis.call('HSET', task_key, 'state', 'succeeded', 'result', body, 'finished_at', jint(now),
      'exec_ms', exec_ms, 'reason', '', 'error', '')
    emit(c, task_key, events_key, 'succeeded', agent, now, '{"exec_ms":' .. jint(exec_ms) .. '}')
    finish(c, task_key, events_key, done_key, 'succeeded')
    status = 'ok'
  elseif outcome == 'retryable_failure' and tonumber(f[4]) < tonumber(f[5]) then
    redis.call('HSET', task_key, 'state', 'retrying', 'error', body, 'last_agent_id', agent)
    local local_id = string.match(f[6], ':(.*)$')
    redis.call('ZADD', KEYS[2], now + backoff, local_id)
    emit(c, task_key, events_key, 'retry_scheduled', agent, now,
      '{"delay_ms":' .. jint(backoff) .. ',"error":' .. jstr(body) .. '}')
    status = 'retry'
  else
    local reason = outcome
    if outcome == 'retryable_failure' then reason = 'retries_exhausted' end
    fail_task(c, task_key, events_key, done_key, KEYS[3], reason, body, agent, now)
    status = 'failed'
  end
  if status == 'ok' then
    redis.call('HSET', health, 'cf:' .. agent, 0, 'ok:' .. agent, jint(now))
  elseif (status == 'failed' or status == 'retry') and outcome ~= 'invalid_request' then
    redis.call('HINCRBY', health, 'cf:' .. agent, 1)
    redis.call('HSET', health, 'lf:' .. agent, jint(now))
  end
  if status == 'ok' or status == 'failed' or status == 'retry' then
    timed = timed + 1
    timed_ms = timed_ms + (tonumber(exec_ms) or 0)
  end
  if ceiling > 0 and (status == 'ok' or status == 'failed' or status == 'retry') then
    if tonumber(exec_ms) > ceiling then
      redis.call('HINCRBY', health, 'cs:' .. agent, 1)
      redis.call('HSET', health, 'ls:' .. agent, jint(now))
    else
      redis.call('HSET', health, 'cs:' .. agent, 0)
    end
  end
  statuses[#statuses + 1] = status
end

local len, pending = inbox_load(inbox)
local cf = redis.call('HGET', health, 'cf:' .. agent) or '0'
redis.call('PUBLISH', ARGV[4] .. 'wake',
  'free ' .. ARGV[6] .. ' ' .. agent .. ' ' .. len .. ' ' .. pending .. ' ' .. cf .. ' ' ..
  timed .. ' ' .. jint(timed_ms))
local out = {len, pending}
for _, s in ipairs(statuses) do out[#out + 1] = s end
return out
