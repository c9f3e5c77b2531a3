-- complete: an agent reports how its tasks ended; each task's outcome is stored and its inbox
-- entry acknowledged in one step, guarded by each attempt's fencing token (_outcome.lua). The
-- same call keeps the agent's health (_health.lua), takes the next ready tasks into its inbox
-- under a standing pull (_pull.lua), gives grants back for a quiet completion (_credits.lua)
-- and tells the dispatchers what changed (`free`, _wake.lua).
-- KEYS[1] the agent's inbox   KEYS[2] delayed zset   KEYS[3] dead-letter stream
-- KEYS[4] capability event feed   KEYS[5] agent tokens hash   KEYS[6] agent health hash
-- KEYS[7] ready queue zset   KEYS[8] pulls hash   KEYS[9] capability stats hash
-- KEYS[10] grants list   KEYS[11] granted hash (see grant.lua)   KEYS[12] policy hash
-- KEYS[13] rate bucket   then KEYS[14+i] the task hash of task i
-- ARGV[1] agent id   ARGV[2] agent token   ARGV[3] feed maxlen   ARGV[4] task channel prefix
-- ARGV[5] result ttl ms   ARGV[6] capability   ARGV[7] latency ceiling ms (0: none)
-- ARGV[8] the highest priority a cold agent's pull may take (cold_start_max_priority)
-- ARGV[9] task key prefix (a pulled task's record is that plus its local id, in this slot)
-- ARGV[10] wake channel   ARGV[11] policy defaults (see _policy.lua)
-- then for task i, 6 values from ARGV[12+6i]: inbox entry id, fencing token, outcome
--   ('success', 'invalid_request', 'failure', 'bad_result', 'retryable_failure'),
--   body (result JSON on success, else the error text), retry backoff ms, execution ms
-- Keeps the agent's speed in its health hash (`sp:`, _health.lua).
-- Returns {'refused'} for a bad token, else {inbox length, inbox pending, tasks pulled,
-- status...} with a status per task: 'ok', 'failed', 'retry', 'stale', 'canceled', 'dup', 'gone'.
local c = context(KEYS[4], ARGV[3], ARGV[4], ARGV[5], KEYS[9])
local inbox, agent = KEYS[1], ARGV[1]
local now = now_ms()
local sha = token_ok(KEYS[5], agent, ARGV[2], c, 'complete', now)
if not sha then return {'refused'} end
local n = #KEYS - 13
local health, ceiling, stats = KEYS[6], tonumber(ARGV[7]), KEYS[9]
local p = nil  -- (the policy, read only when a retry decision or a pull needs it)
local function policy()
  p = p or load_policy(KEYS[12], ARGV[11])
  return p
end
local r = {agent = agent, now = now, now_s = jint(now), policy = policy,
           token_sha = function() return sha end}
local statuses, entries = {}, {}
local timed, timed_ms = 0, 0  -- attempts that ran to an end here, and their execution time
local ok_ms = {}  -- execution times of the successes (the agent's speed, _health.lua)
local h = {succeeded = false, failures = 0, failed_any = false, slow_reset = false, slow = 0,
           slow_any = false}
local oks, by_grant = 0, 0  -- successes, and those of tasks that came by grant (credits)

for i = 0, n - 1 do
  local a = 12 + 6 * i
  entries[i + 1] = ARGV[a]
  r.fence, r.outcome, r.body = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  r.backoff, r.exec_ms = ARGV[a + 4], ARGV[a + 5]  -- (text: a retry converts the backoff)
  local status, f = apply_outcome(c, r, KEYS[14 + i], KEYS[3], KEYS[2])
  if status == 'ok' then
    oks = oks + 1
    ok_ms[oks] = r.exec_ms
    -- (`round|why|score|eligible`: only `why` can read 'grant'; a plain find, on a drain's path)
    if f[13] and string.find(f[13], '|grant|', 1, true) then by_grant = by_grant + 1 end
  elseif status == 'retry' then
    count(c, STAT_RETRIES, 1)
  elseif status == 'stale' then
    count(c, STAT_LATE_RESULTS, 1)
  end
  if status == 'ok' or status == 'failed' or status == 'retry' then
    timed = timed + 1
    timed_ms = timed_ms + (tonumber(r.exec_ms) or 0)
  end
  if status ~= 'ok' or ceiling > 0 then
    note_health(h, status, r.outcome, r.exec_ms, ceiling)
  else
    h.succeeded, h.failures = true, 0  -- (note_health's case of a success with no ceiling)
  end
  statuses[i + 1] = status
end

if n > 0 then
  redis.call('XACK', inbox, AGENT_GROUP, unpack(entries))
  local removed = redis.call('XDEL', inbox, unpack(entries))
  -- (a success's entry counts as gone with it: see broker/keys.py note (8))
  if oks > 0 then redis.call('HINCRBY', stats, STAT_SUCCEEDED, oks) end
  if removed ~= oks then count(c, STAT_REMOVED, removed - oks) end
end

-- A pull needs a success that left no failure after it (the agent's circuit is closed); whether
-- its failures were at 0 before as well decides below whether the dispatchers need to hear.
local pull, cf_before = nil, nil
local all_ok = n > 0 and oks == n
if h.succeeded and h.failures == 0 then
  pull = redis.call('HGET', KEYS[8], agent)
  if pull or all_ok then cf_before = redis.call('HGET', health, 'cf:' .. agent) end
end
local cf = record_health(health, agent, h, r.now_s)
local speed = speed_after(health, agent, ok_ms)
local tell_speed = speed ~= nil and speed[4]

local len, pending = inbox_load(inbox)
local pulled = 0
-- (Pulls stand while the queue is empty too, see dispatcher/grants.py: nothing to take then.)
local waiting = redis.call('ZCARD', KEYS[7]) > 0
if not waiting then pull = nil end
if pull and ceiling > 0 and tonumber(redis.call('HGET', health, 'cs:' .. agent) or '0') > 0 then
  pull = nil
end
if pull and (policy().paused or redis.call('HEXISTS', KEYS[5], DRAINING .. agent) == 1) then pull = nil end
if pull then
  local p = policy()
  local want = math.max(0, math.min(timed, pull_limit(pull) - (len - pending), room_to_run(stats, p)))
  local tokens = take_tokens(KEYS[13], p, want, now)
  local pp = {queue = KEYS[7], dlq = KEYS[3], task_prefix = ARGV[9], low_max = tonumber(ARGV[8]),
              policy = p}
  pulled = pull_ready(c, pp, agent, inbox, pull, tokens, now, r.now_s)
  give_back_tokens(KEYS[13], p, tokens - pulled)
  if pulled > 0 then
    len = len + pulled
    redis.call('HINCRBY', stats, STAT_PULLED, pulled)
  end
end
flush_feed(c)

-- A quiet completion (_credits.lua): give the grants back and tell nobody.
local quiet = all_ok and not h.slow_any and not tell_speed and pulled == 0 and (cf_before or '0') == '0'
  and not waiting and quiet_credits({grants = KEYS[10], granted = KEYS[11], tokens = KEYS[5]}, agent, by_grant)

-- The dispatchers keep each agent's load, health and speed from these messages. A call that
-- refilled every slot it freed, after and before a success, changed neither (its inbox holds as
-- many entries as before): nothing to tell, and no dispatcher wakes for it; nor for a quiet
-- one; unless the agent's speed is news (a slow agent must lose its share now, not at its next
-- heartbeat).
local told = speed and speed[5]
if tell_speed or (not quiet and not (pulled > 0 and pulled == timed and (cf_before or '0') == '0')) then
  wake_free(ARGV[10], ARGV[6], agent, len, pending, cf, timed, timed_ms, pulled, speed and speed[1])
  told = speed and speed[2]
end
if speed then redis.call('HSET', health, 'sp:' .. agent, speed[1] .. ' ' .. string.format('%.1f', told)) end
local out = {len, pending, pulled}
for _, s in ipairs(statuses) do out[#out + 1] = s end
return out
