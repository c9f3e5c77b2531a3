-- dispatch: hand ready tasks to one agent's inbox, atomically, never past its backlog limit.
-- KEYS[1] queue zset   KEYS[2] the agent's inbox stream   KEYS[3] inboxes set   KEYS[4] sessions hash
-- KEYS[5] capability event feed   KEYS[6] dead-letter stream   KEYS[7] agent tokens hash
-- KEYS[8] capability stats hash (counts what was dispatched)
-- then for task i (0-based): KEYS[9+3i] task hash, KEYS[10+3i] task events, KEYS[11+3i] task done list
-- ARGV[1] agent id   ARGV[2] most unread entries the inbox may hold   ARGV[3] feed maxlen
-- ARGV[4] channel prefix   ARGV[5] result ttl ms
-- then for task i: ARGV[6+2i] its local id, ARGV[7+2i] why this agent (JSON, kept in the record
-- for `reach explain`; '' for none)
-- A task another dispatcher already took (no longer in the queue) is skipped; a task past its
-- deadline fails with reason `expired` instead of being delivered. Tasks left when the inbox is
-- full stay in the queue for another agent. An agent that deregistered (no token) or is
-- draining gets nothing, whatever the caller's view of the registry says.
-- Returns {inbox length, inbox pending, dispatched, taken, expired, left}.
local c = {feed = KEYS[5], feed_maxlen = tonumber(ARGV[3]), chan = ARGV[4], ttl = tonumber(ARGV[5])}
local inbox, agent, max_unread = KEYS[2], ARGV[1], tonumber(ARGV[2])
local n = (#KEYS - 8) / 3

if redis.call('HEXISTS', KEYS[7], agent) == 0 or redis.call('HEXISTS', KEYS[7], 'draining:' .. agent) == 1 then
  return {0, 0, 0, 0, 0, n}
end
if redis.call('EXISTS', inbox) == 0 then
  redis.call('XGROUP', 'CREATE', inbox, 'agents', '0', 'MKSTREAM')
end
redis.call('SADD', KEYS[3], agent)
local len, pending = inbox_load(inbox)
local now = now_ms()
local dispatched, taken, expired, left = 0, 0, 0, 0
for i = 0, n - 1 do
  local task_key, events_key, done_key = KEYS[9 + 3 * i], KEYS[10 + 3 * i], KEYS[11 + 3 * i]
  local local_id, why = ARGV[6 + 2 * i], ARGV[7 + 2 * i]
  if len - pending >= max_unread then
    left = n - i
    break
  end
  if redis.call('ZREM', KEYS[1], local_id) == 0 then
    taken = taken + 1
  else
    local f = redis.call('HMGET', task_key, 'state', 'deadline_at', 'session_id')
    local deadline = tonumber(f[2]) or 0
    if f[1] ~= 'queued' then
      taken = taken + 1
    elseif deadline > 0 and now >= deadline then
      fail_task(c, task_key, events_key, done_key, KEYS[6], 'expired', 'deadline passed while queued', nil, now)
      expired = expired + 1
    else
      local fence = redis.call('HINCRBY', task_key, 'fence', 1)
      redis.call('HSET', task_key, 'state', 'dispatched', 'agent_id', agent,
        'dispatched_at', jint(now))
      if why ~= '' then redis.call('HSET', task_key, 'explain', why) end
      redis.call('XADD', inbox, '*', 'id', local_id, 'fence', fence)
      if f[3] and f[3] ~= '' then redis.call('HSET', KEYS[4], f[3], agent) end
      emit(c, task_key, events_key, 'dispatched', agent, now, '{"fence":' .. fence .. '}')
      len = len + 1
      dispatched = dispatched + 1
    end
  end
end
if dispatched > 0 then redis.call('HINCRBY', KEYS[8], 'dispatched', dispatched) end
return {len, pending, dispatched, taken, expired, left}
