-- expire: fail tasks whose deadline passed, wherever they are (queued, waiting for a retry,
-- dispatched, running), and tasks no agent started within no_agent_timeout.
-- KEYS[1] deadlines zset (local id -> when to look at it, ms)   KEYS[2] queue zset
-- KEYS[3] delayed zset   KEYS[4] dead-letter stream   KEYS[5] capability event feed
-- KEYS[6] capability stats hash   KEYS[7] policy hash   then KEYS[8+i] the task hash of task i
-- ARGV[1] feed maxlen   ARGV[2] task channel prefix   ARGV[3] result ttl ms
-- ARGV[4] policy defaults (the no-agent timeout is the policy's; 0: off)
-- ARGV[5] the capability's inbox key prefix (an inbox is that plus the agent id, in this
-- capability's slot)   ARGV[6] the control channel prefix
-- (an agent's is that plus its id)   then ARGV[7+i] the local id of task i
-- A running task's agent is told to stop (control channel) and the fence moves, so its late
-- result is refused. A dispatched task's entry is taken out of its inbox while unread (agents
-- start what they read at once, before the start is recorded: it must not start at all); one
-- already read belongs to an agent that is told to stop.
-- Entries of tasks that ended meanwhile are dropped from the index.
-- Returns {expired, no_agent, rescheduled}.
local c = context(KEYS[5], ARGV[1], ARGV[2], ARGV[3])
local nat = load_policy(KEYS[7], ARGV[4]).nat
local n = #KEYS - 7

-- The task's agent told to stop, and its entry taken back if still unread (see above).
local function recall(t)
  if (t.state ~= 'running' and t.state ~= 'dispatched') or not t.agent_id or t.agent_id == '' then
    return
  end
  if t.state == 'dispatched' and t.entry then
    local inbox = ARGV[5] .. t.agent_id
    -- (pcall: the inbox of an agent that deregistered is gone, with its group)
    local read = redis.pcall('XPENDING', inbox, AGENT_GROUP, t.entry, t.entry, 1)
    if type(read) == 'table' and not read.err and #read == 0 then
      count_active(KEYS[6], -redis.call('XDEL', inbox, t.entry))
      return
    end
  end
  redis.call('PUBLISH', ARGV[6] .. t.agent_id, 'cancel ' .. t.id)
end

local now = now_ms()
local expired, no_agent, later = 0, 0, 0
for i = 0, n - 1 do
  local local_id = ARGV[7 + i]
  local t = load_task(KEYS[8 + i], {'state', 'deadline_at', 'created_at', 'agent_id', 'replayed_at',
                                    'fence', 'entry', 'due_at'})
  local state = t.state
  local deadline = tonumber(t.deadline_at) or 0
  local not_started_by = 0
  -- (counted from the task's creation, its start time if scheduled, or its last replay out of
  -- the dead-letter stream)
  local since = math.max(tonumber(t.created_at) or 0, tonumber(t.replayed_at) or 0,
                         tonumber(t.due_at) or 0)
  if nat > 0 and (tonumber(t.attempt) or 0) == 0 then not_started_by = since + nat end
  if not state or state == 'succeeded' or state == 'failed' or state == 'canceled' then
    redis.call('ZREM', KEYS[1], local_id)
  elseif deadline > 0 and now >= deadline then
    redis.call('ZREM', KEYS[1], local_id)
    redis.call('ZREM', KEYS[2], local_id)
    redis.call('ZREM', KEYS[3], local_id)
    set(t, 'fence', (tonumber(t.fence) or 0) + 1)
    recall(t)
    fail_task(c, t, KEYS[4], 'expired', 'deadline passed while ' .. state, t.agent_id, now)
    expired = expired + 1
  elseif not_started_by > 0 and now >= not_started_by and (state == 'queued' or state == 'dispatched') then
    redis.call('ZREM', KEYS[1], local_id)
    redis.call('ZREM', KEYS[2], local_id)
    set(t, 'fence', (tonumber(t.fence) or 0) + 1)
    recall(t)
    fail_task(c, t, KEYS[4], 'no_agent_timeout',
      'no agent started the task within ' .. nat .. ' ms', t.agent_id, now)
    no_agent = no_agent + 1
  else
    local next_look = 0
    if deadline > 0 then next_look = deadline end
    if not_started_by > now and (next_look == 0 or not_started_by < next_look) then
      next_look = not_started_by
    end
    if next_look > 0 then
      redis.call('ZADD', KEYS[1], next_look, local_id)
      later = later + 1
    else
      redis.call('ZREM', KEYS[1], local_id)
    end
  end
end
flush_feed(c)
return {expired, no_agent, later}
