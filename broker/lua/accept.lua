-- accept: an agent takes tasks it read from its inbox and starts running them.
-- KEYS[1] the agent's inbox   KEYS[2] dead-letter stream   KEYS[3] capability event feed
-- KEYS[4] agent tokens hash   KEYS[5] capability stats hash (counts)   KEYS[6] policy hash
-- then KEYS[7+i] the task hash of task i
-- ARGV[1] agent id   ARGV[2] agent token   ARGV[3] feed maxlen   ARGV[4] task channel prefix
-- ARGV[5] result ttl ms   ARGV[6] '1' when the agent started the tasks already (from what their
-- inbox entries carry: this call only records it), '0' when it waits for this reply to start
-- them   ARGV[7] policy defaults (see _policy.lua)
-- then for task i: ARGV[8+3i] inbox entry id, ARGV[9+3i] fencing token, ARGV[10+3i] ms the
-- agent has run it already (0 when it waits): its start is recorded as that long ago
-- Only the delivery the task currently expects (same agent, same fence, state dispatched) may
-- start; any other entry is a stale copy and is acknowledged away without running.
-- Returns {'refused'} for a bad token, else for each task 10 values: status ('ok', 'gone',
-- 'stale', 'canceled', 'expired', 'failed', or 'done' when the task's result was stored
-- already: the agent reported it before this record of its start), and for 'ok' when the agent
-- waits (ARGV[6] '0'): payload, attempt, timeout ms, deadline at, trace context (the
-- record's `trace`: broker/protocol/trace.py), session id,
-- metadata, max attempts, task id ('' otherwise).
local c = context(KEYS[3], ARGV[3], ARGV[4], ARGV[5], KEYS[5])
local inbox, agent = KEYS[1], ARGV[1]
local now = now_ms()
local token_sha = token_ok(KEYS[4], agent, ARGV[2], c, 'accept', now)
if not token_sha then return {'refused'} end
local started = ARGV[6] == '1'
local n = #KEYS - 6
local p = nil  -- (the policy, read only when a row needs it)
local function policy()
  p = p or load_policy(KEYS[6], ARGV[7])
  return p
end
local out = {}
local names = {'state', 'fence', 'agent_id', 'deadline_at', 'accepted_by', 'max_attempts', 'dispatched_at'}
if not started then
  for _, f in ipairs({'payload', 'timeout_ms', 'trace', 'session_id', 'metadata'}) do
    names[#names + 1] = f
  end
end

local function row(status, t)
  out[#out + 1] = status
  if status == 'ok' and not started then
    local r = {t.payload, t.attempt, own_or(t.timeout_ms, policy().timeout_ms), t.deadline_at, t.trace,
               t.session_id, t.metadata, own_or(t.max_attempts, policy().max_attempts), t.id}
    for j = 1, 9 do out[#out + 1] = r[j] or '' end
  else
    for _ = 1, 9 do out[#out + 1] = '' end
  end
end

local function drop(entry)
  redis.call('XACK', inbox, AGENT_GROUP, entry)
  count(c, STAT_REMOVED, redis.call('XDEL', inbox, entry))
end

local function start(t, at)
  start_attempt(c, t, agent, token_sha, at)
  save(t)
end

for i = 0, n - 1 do
  local entry, fence = ARGV[8 + 3 * i], ARGV[9 + 3 * i]
  local t = load_task(KEYS[7 + i], names)
  local at = math.max(now - (tonumber(ARGV[10 + 3 * i]) or 0), tonumber(t.dispatched_at) or 0)
  local mine = t.fence == fence and t.agent_id == agent
  if not t.state then
    drop(entry)
    row('gone', t)
  elseif t.state == 'running' and mine and t.accepted_by == token_sha then
    -- Accepted already by this very process: the call was retried after its reply was lost.
    row('ok', t)
  elseif t.state == 'running' and mine then
    -- Accepted by an earlier incarnation of this agent id, which died while running it. This
    -- is a new attempt (so a task that kills its worker every time still ends in the DLQ).
    if tonumber(t.attempt) >= (tonumber(t.max_attempts) or tonumber(policy().max_attempts)) then
      drop(entry)
      fail_task(c, t, KEYS[2], 'retries_exhausted',
        'the agent restarted while running the task, ' .. t.attempt .. ' time(s)', agent, now)
      row('failed', t)
    else
      event(c, t, 'reclaimed', agent, now, '{"reason":"agent restarted"}')
      count(c, STAT_RECLAIMS, 1)
      start(t, at)
      row('ok', t)
    end
  elseif mine and t.state ~= 'dispatched' and t.state ~= 'canceled' then
    -- The agent's report of how this attempt ended arrived first (and started it, see
    -- complete.lua): nothing to record any more.
    row('done', t)
  elseif not mine or (t.state ~= 'dispatched' and t.state ~= 'canceled') then
    drop(entry)
    row('stale', t)
  elseif t.state == 'canceled' then
    drop(entry)
    row('canceled', t)
  elseif (tonumber(t.deadline_at) or 0) > 0 and at >= tonumber(t.deadline_at) then
    drop(entry)
    fail_task(c, t, KEYS[2], 'expired', 'deadline passed before the task started', agent, now)
    row('expired', t)
  else
    start(t, at)
    row('ok', t)
  end
end
flush_feed(c)
return out
