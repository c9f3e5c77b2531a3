-- A capability's policy as the scripts apply it (broker/policy.py): read once per call from the
-- capability's policy hash, each field falling back to the caller's settings (`defaults`,
-- packed by broker/protocol/calls.py: max attempts|timeout ms|aging ms|max queue depth|
-- no-agent timeout ms|rate|burst|max running) while no dispatcher has seeded it. The starts a
-- call may make are held to the rate (a token bucket by the server clock) and to max_running
-- (against the `active` count of the stats hash: tasks in the capability's inboxes).

local POLICY_FIELDS = {'max_attempts', 'timeout_ms', 'aging_ms', 'max_queue_depth',
                       'no_agent_timeout_ms', 'rate', 'burst', 'max_running', 'paused'}

local function load_policy(key, defaults)
  local v = redis.call('HMGET', key, unpack(POLICY_FIELDS))
  local d = {}
  for x in string.gmatch(defaults, '[^|]+') do d[#d + 1] = tonumber(x) end
  local p = {max_attempts = tonumber(v[1]) or d[1], timeout_ms = tonumber(v[2]) or d[2],
             aging = tonumber(v[3]) or d[3], max_depth = tonumber(v[4]) or d[4],
             nat = tonumber(v[5]) or d[5], rate = tonumber(v[6]) or d[6] or 0,
             burst = tonumber(v[7]) or d[7] or 0, max_running = tonumber(v[8]) or d[8] or 0,
             paused = v[9] == '1'}
  if p.burst <= 0 then p.burst = math.max(1, math.ceil(p.rate)) end
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

-- How many more tasks may be handed out under max_running (a large number without a cap).
local function room_to_run(stats_key, p)
  if p.max_running <= 0 then return 1e9 end
  return math.max(0, p.max_running - (tonumber(redis.call('HGET', stats_key, 'active')) or 0))
end

local function count_active(stats_key, delta)
  if delta ~= 0 then redis.call('HINCRBY', stats_key, 'active', delta) end
end
