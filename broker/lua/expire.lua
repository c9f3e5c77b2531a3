-- expire: fail tasks whose deadline passed, wherever they are (queued, scheduled, waiting for a
-- retry, dispatched, running). (Tasks no agent could take: no_agent.lua.)
-- KEYS[1] deadlines zset (local id -> its deadline, ms)   KEYS[2] queue zset
-- KEYS[3] delayed zset   KEYS[4] dead-letter stream   KEYS[5] capability event feed
-- KEYS[6] capability stats hash   then KEYS[7+i] the task hash of task i
-- ARGV[1] feed maxlen   ARGV[2] task channel prefix   ARGV[3] result ttl ms
-- ARGV[4] the capability's inbox key prefix (an inbox is that plus the agent id, in this
-- capability's slot)   ARGV[5] the control channel prefix (an agent's is that plus its id)
-- then ARGV[6+i] the local id of task i
-- A running task's agent is told to stop (control channel) and the fence moves, so its late
-- result is refused. A dispatched task's entry is taken out of its inbox while unread (agents
-- start what they read at once, before the start is recorded: it must not start at all); one
-- already read belongs to an agent that is told to stop.
-- Entries of tasks that ended meanwhile are dropped from the index.
-- Returns {expired, rescheduled}.
local c = context(KEYS[5], ARGV[1], ARGV[2], ARGV[3], KEYS[6])
local n = #KEYS - 6

-- The task's agent told to stop, and its entry taken back if still unread (see above).
local function recall(t)
  if (t.state ~= 'running' and t.state ~= 'dispatched') or not t.agent_id or t.agent_id == '' then
    return
  end
  if t.state == 'dispatched' and t.entry then
    local inbox = ARGV[4] .. t.agent_id
    -- (pcall: the inbox of an agent that deregistered is gone, with its group)
    local read = redis.pcall('XPENDING', inbox, AGENT_GROUP, t.entry, t.entry, 1)
    if type(read) == 'table' and not read.err and #read == 0 then
      count(c, STAT_REMOVED, redis.call('XDEL', inbox, t.entry))
      return
    end
  end
  redis.call('PUBLISH', ARGV[5] .. t.agent_id, 'cancel ' .. t.id)
end

local now = now_ms()
local expired, later = 0, 0
for i = 0, n - 1 do
  local local_id = ARGV[6 + i]
  local t = load_task(KEYS[7 + i], {'state', 'deadline_at', 'agent_id', 'fence', 'entry'})
  local state = t.state
  local deadline = tonumber(t.deadline_at) or 0
  if not state or state == 'succeeded' or state == 'failed' or state == 'canceled' or deadline <= 0 then
    redis.call('ZREM', KEYS[1], local_id)
  elseif now >= deadline then
    redis.call('ZREM', KEYS[1], local_id)
    redis.call('ZREM', KEYS[2], local_id)
    redis.call('ZREM', KEYS[3], local_id)
    set(t, 'fence', (tonumber(t.fence) or 0) + 1)
    recall(t)
    fail_task(c, t, KEYS[4], 'expired', 'deadline passed while ' .. state, t.agent_id, now)
    expired = expired + 1
  else
    -- (a deadline moved, by a replay)
    redis.call('ZADD', KEYS[1], deadline, local_id)
    later = later + 1
  end
end
flush_feed(c)
return {expired, later}
