-- The agent health hash keeps, per agent, what routing needs (broker/protocol/health.py parses
-- it): consecutive failures and the time of the last one (circuit breaker: `cf:`, `lf:`), the
-- last success (affinity: `ok:`), consecutive tasks over the latency ceiling and the last one
-- (ejection: `cs:`, `ls:`). An invalid request is the request's fault and counts for neither.

-- Take in one completion call's changes, in order: `h` = {succeeded (any success), failures
-- (since the last success, or all), failed_any, slow_reset (a task within the ceiling), slow
-- (over the ceiling since), slow_any}. Returns the consecutive failures now.
local function record_health(health, agent, h, now_s)
  local cf
  if h.succeeded then
    cf = h.failures
    redis.call('HSET', health, 'cf:' .. agent, h.failures, 'ok:' .. agent, now_s)
  elseif h.failures > 0 then
    cf = redis.call('HINCRBY', health, 'cf:' .. agent, h.failures)
  else
    cf = redis.call('HGET', health, 'cf:' .. agent) or '0'
  end
  if h.failed_any then redis.call('HSET', health, 'lf:' .. agent, now_s) end
  if h.slow_reset then
    redis.call('HSET', health, 'cs:' .. agent, h.slow)
  elseif h.slow > 0 then
    redis.call('HINCRBY', health, 'cs:' .. agent, h.slow)
  end
  if h.slow_any then redis.call('HSET', health, 'ls:' .. agent, now_s) end
  return cf
end

-- Count one report's status into `h` (see record_health); `exec_ms` against the ceiling (0: none).
local function note_health(h, status, outcome, exec_ms, ceiling)
  if status == 'ok' then
    h.succeeded, h.failures = true, 0
  elseif (status == 'failed' or status == 'retry') and outcome ~= 'invalid_request' then
    h.failures, h.failed_any = h.failures + 1, true
  end
  if ceiling > 0 and (status == 'ok' or status == 'failed' or status == 'retry') then
    if tonumber(exec_ms) > ceiling then
      h.slow, h.slow_any = h.slow + 1, true
    else
      h.slow_reset, h.slow = true, 0
    end
  end
end
