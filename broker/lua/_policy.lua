-- A capability's policy as the scripts apply it (broker/policy.py). Its hash keeps every field
-- also packed in one field, POLICY_PACKED_FIELD, which is all a script reads (one HGET and one
-- match: reading and converting the fields one by one cost a hot script a tenth of its time):
--   gated|max_attempts|timeout_ms|aging_ms|max_queue_depth|no_agent_timeout_ms|rate|burst|
--   max_running|paused
-- (broker/protocol/policy_pack.py defines the layout; `gated` is '1' when a start limit applies:
-- paused, a rate or a max_running; '?' when a field is not set and the caller's `defaults`,
-- packed alike, fill it in). The starts a call may make are held to the rate (a token bucket by
-- the server clock) and to max_running (against the tasks in the capability's inboxes, as the
-- stats hash's counters tell them: active_count).

local POLICY_PATTERN = '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$'

-- The fields as text; max attempts, timeout, aging, depth and no-agent timeout stay text (a
-- script converts what it uses: every tonumber is a strtod), the start limits are converted.
local function unpack_policy(packed)
  local g, ma, tm, ag, md, nat, rate, burst, mr, paused = string.match(packed, POLICY_PATTERN)
  return {gated = g, max_attempts = ma, timeout_ms = tm, aging = ag, max_depth = md, nat = nat,
          rate = rate, burst = burst, max_running = mr, paused = paused}
end

-- Rewrite the packed field from the hash's fields (by the policy scripts, after a change).
local function pack_policy(key)
  local v = redis.call('HMGET', key, 'max_attempts', 'timeout_ms', 'aging_ms', 'max_queue_depth',
                       'no_agent_timeout_ms', 'rate', 'burst', 'max_running', 'paused')
  local gated = '0'
  for i = 1, 9 do
    if not v[i] then v[i] = ''; gated = '?' end
  end
  if gated == '0' and (v[9] == '1' or (tonumber(v[6]) or 0) > 0 or (tonumber(v[8]) or 0) > 0) then
    gated = '1'
  end
  redis.call('HSET', key, POLICY_PACKED_FIELD, gated .. '|' .. table.concat(v, '|'))
end

local POLICY_NAMES = {'max_attempts', 'timeout_ms', 'aging', 'max_depth', 'nat', 'rate', 'burst',
                      'max_running', 'paused'}

local function load_policy(key, defaults)
  local packed = redis.call('HGET', key, POLICY_PACKED_FIELD)
  local p = unpack_policy(packed or defaults)
  if p.gated == '?' then
    local d = unpack_policy(defaults)
    for _, name in ipairs(POLICY_NAMES) do
      if p[name] == '' then p[name] = d[name] end
    end
    p.gated = (p.paused == '1' or (tonumber(p.rate) or 0) > 0 or (tonumber(p.max_running) or 0) > 0)
      and '1' or '0'
  end
  if p.gated == '1' then
    p.rate, p.burst, p.max_running = tonumber(p.rate) or 0, tonumber(p.burst) or 0, tonumber(p.max_running) or 0
    if p.burst <= 0 then p.burst = math.max(1, math.ceil(p.rate)) end
    p.paused = p.paused == '1'
  else
    p.rate, p.burst, p.max_running, p.paused = 0, 0, 0, false
  end
  return p
end

-- Take up to `want` start tokens (all of them when no rate is set); returns how many.
local function take_tokens(key, p, want, now)
  if p.rate <= 0 or want <= 0 then return want end
  local b = redis.call('HMGET', key, 't', 'at')
  local tokens, at = tonumber(b[1]), tonumber(b[2])
  if not tokens or not at then tokens, at = p.burst, now end
  tokens = math.min(p.burst, tokens + math.max(0, now - at) * p.rate / 1000)
  local n = math.min(want, math.floor(tokens))
  redis.call('HSET', key, 't', string.format('%.6f', tokens - n), 'at', jint(now))
  redis.call('PEXPIRE', key, math.ceil(p.burst / p.rate * 1000) + 60000)
  return n
end

-- Give back tokens taken and not used (a task already taken, an inbox full).
local function give_back_tokens(key, p, n)
  if p.rate > 0 and n > 0 then redis.call('HINCRBYFLOAT', key, 't', n) end
end

-- How long until the next token, in ms (0: one is there, or no rate is set).
local function token_wait_ms(key, p, now)
  if p.rate <= 0 then return 0 end
  local b = redis.call('HMGET', key, 't', 'at')
  local tokens = tonumber(b[1])
  if not tokens then return 0 end
  tokens = tokens + math.max(0, now - (tonumber(b[2]) or now)) * p.rate / 1000
  if tokens >= 1 then return 0 end
  return math.ceil((1 - tokens) / p.rate * 1000)
end

-- The tasks handed out (in the capability's inboxes, dispatched or running): what its counters
-- say went in less what came out (broker/keys.py note (8)).
local function active_count(stats_key)
  local v = redis.call('HMGET', stats_key, STAT_DIRECT, STAT_ROUTED, STAT_PULLED, STAT_SUCCEEDED,
                       STAT_REMOVED)
  return (tonumber(v[1]) or 0) + (tonumber(v[2]) or 0) + (tonumber(v[3]) or 0)
    - (tonumber(v[4]) or 0) - (tonumber(v[5]) or 0)
end

-- How many more tasks may be handed out under max_running (a large number without a cap).
local function room_to_run(stats_key, p)
  if p.max_running <= 0 then return 1e9 end
  return math.max(0, p.max_running - active_count(stats_key))
end

