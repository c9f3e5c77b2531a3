-- The agent health hash keeps, per agent, what routing needs (broker/protocol/health.py parses
-- it): consecutive failures and the time of the last one (circuit breaker: `cf:`, `lf:`), the
-- last success (affinity: `ok:`), consecutive tasks over the latency ceiling and the last one
-- (ejection: `cs:`, `ls:`), and its speed (`sp:`, see speed_after). An invalid request is the
-- request's fault and counts for neither.

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

-- An agent's speed (`sp:<agent>` = `<ms> <samples> <told ms>`, parsed by
-- broker/protocol/health.py, whose SPEED_* constants these are): a moving geometric mean of its
-- successful tasks' execution times (`times`: this call's, in order), each below the floor
-- counted as the floor; a plain mean of the first 1 / alpha. Geometric, because task times are
-- heavy-tailed: one long call moves it by a fraction, ten slow calls in a row by most of the
-- way. Returns {new field value without `told`, ms, samples, whether the dispatchers must be
-- told (the speed just became known, or moved SPEED_TELL times either way since they last
-- heard it), the speed they last heard}, or nil for a call without successes.
local function speed_after(health, agent, times)
  if #times == 0 then return nil end
  local alpha, known, floor, tell = 0.2, 5, 10, 1.5
  local before = redis.call('HGET', health, 'sp:' .. agent)
  local ms, n, told = 0, 0, 0
  if before then
    local a, b, c = string.match(before, '^(%S+) (%d+) (%S+)$')
    ms, n, told = tonumber(a) or 0, tonumber(b) or 0, tonumber(c) or 0
    if ms <= 0 then n = 0 end
  end
  local log = n > 0 and math.log(ms) or 0
  for _, t in ipairs(times) do
    n = n + 1
    log = log + math.max(alpha, 1 / n) * (math.log(math.max(tonumber(t) or 0, floor)) - log)
  end
  n = math.min(n, 1000)
  ms = math.exp(log)
  local news = n >= known and (told <= 0 or ms >= tell * told or told >= tell * ms)
  return {string.format('%.1f %d', ms, n), ms, n, news, told}
end
