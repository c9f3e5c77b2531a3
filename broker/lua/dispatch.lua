-- dispatch: hand ready tasks to agents' inboxes, atomically, never past an inbox's backlog limit
-- nor past the capability's policy (paused, rate, max_running: _policy.lua). One call serves
-- one routing round's choices for one or more agents.
-- KEYS[1] queue zset   KEYS[2] capability event feed   KEYS[3] dead-letter stream
-- KEYS[4] agent tokens hash   KEYS[5] capability stats hash (counts what was routed, expired)
-- KEYS[6] sessions hash   KEYS[7] policy hash   KEYS[8] rate bucket
-- then KEYS[9..8+A] the inbox of agent j, then the task hash of each task, in the order of ARGV
-- ARGV[1] feed maxlen   ARGV[2] task channel prefix   ARGV[3] result ttl ms   ARGV[4] A, the agents
-- ARGV[5] how many of the ready tasks left in the queue afterwards to return (0: none): the
-- caller's next round starts from them instead of reading the queue again
-- ARGV[6] policy defaults (see _policy.lua)
-- then for agent j, 3 values from ARGV[7+3j]: agent id, most unread entries its inbox may hold,
-- its task count
-- then for each task, agent by agent, 2 values: its local id, why this agent (kept in the
-- record for `reach explain`; '' for none)
-- A task another dispatcher already took (no longer in the queue) is skipped; a task past its
-- deadline fails with reason `expired` instead of being delivered. Tasks left when an inbox is
-- full, or the policy allows no more starts, stay in the queue. An agent that deregistered (no
-- token) or is draining gets nothing, whatever the caller's view of the registry says. Each
-- inbox entry carries what the agent needs to start the task (see deliver in _delivery.lua).
-- Returns the policy's hold first: 0 none, -1 paused, -2 at max_running, else the ms until the
-- rate allows the next start; then for each agent 6 values: inbox length, inbox pending (-1:
-- not looked at, the inbox being far from its limit), dispatched, taken, expired, left;
-- then the first ARGV[5] ready tasks as local id, score pairs.
local c = context(KEYS[2], ARGV[1], ARGV[2], ARGV[3], KEYS[5])
local stats = KEYS[5]
local p = load_policy(KEYS[7], ARGV[6])
local agents = tonumber(ARGV[4])
local now = now_ms()
local now_s = jint(now)
local total = #KEYS - 8 - agents
local hold, allowed, tokens = 0, 0, 0
if p.paused then
  hold = -1
else
  local running_room = room_to_run(stats, p)
  tokens = take_tokens(KEYS[8], p, math.min(total, running_room), now)
  allowed = tokens
  if allowed < total then
    if tokens < math.min(total, running_room) then hold = math.max(1, token_wait_ms(KEYS[8], p, now))
    else hold = -2 end
  end
end
local out = {hold}
local dispatched_all = 0
local task_i = 0  -- tasks handled so far (their keys follow the inboxes)

for j = 0, agents - 1 do
  local inbox = KEYS[9 + j]
  local agent, max_unread, count = ARGV[7 + 3 * j], tonumber(ARGV[8 + 3 * j]), tonumber(ARGV[9 + 3 * j])
  local first = task_i
  task_i = task_i + count
  if not takes_work(KEYS[4], agent) then
    out[#out + 1] = 0; out[#out + 1] = 0; out[#out + 1] = 0
    out[#out + 1] = 0; out[#out + 1] = 0; out[#out + 1] = count
  elseif allowed <= 0 then
    -- (held by the policy: its tasks stay queued; its load as far as one command tells)
    out[#out + 1] = redis.call('XLEN', inbox); out[#out + 1] = -1; out[#out + 1] = 0
    out[#out + 1] = 0; out[#out + 1] = 0; out[#out + 1] = count
  else
    -- (An agent with a token has an inbox with its group: registration makes them, and both
    -- go only once the token went.) How many it has read matters only near the limit.
    local len, pending = redis.call('XLEN', inbox), -1
    if len + count > max_unread then len, pending = inbox_load(inbox) end
    local dispatched, taken, expired, left = 0, 0, 0, 0
    for i = first, first + count - 1 do
      local task_key = KEYS[9 + agents + i]
      local a = 7 + 3 * agents + 2 * i
      local local_id = ARGV[a]
      if (pending >= 0 and len - pending >= max_unread) or allowed <= 0 then
        left = first + count - i
        break
      end
      if redis.call('ZREM', KEYS[1], local_id) == 0 then
        taken = taken + 1
      else
        local f = redis.call('HMGET', task_key, unpack(DELIVERY_FIELDS))
        local deadline = tonumber(f[7]) or 0
        if f[1] ~= 'queued' then
          taken = taken + 1
        elseif deadline > 0 and now >= deadline then
          fail_task(c, load_task(task_key, {'state'}), KEYS[3], 'expired',
            'deadline passed while queued', nil, now)
          expired = expired + 1
        else
          deliver(c, p, task_key, f, {}, inbox, agent, local_id, now_s, ARGV[a + 1])
          if f[11] and f[11] ~= '' then redis.call('HSET', KEYS[6], f[11], agent) end
          len = len + 1
          dispatched = dispatched + 1
          allowed = allowed - 1
        end
      end
    end
    dispatched_all = dispatched_all + dispatched
    out[#out + 1] = len; out[#out + 1] = pending; out[#out + 1] = dispatched
    out[#out + 1] = taken; out[#out + 1] = expired; out[#out + 1] = left
  end
end
if dispatched_all > 0 then redis.call('HINCRBY', stats, STAT_ROUTED, dispatched_all) end
give_back_tokens(KEYS[8], p, tokens - dispatched_all)
flush_feed(c)
local peek = tonumber(ARGV[5])
if peek > 0 then
  for _, v in ipairs(redis.call('ZRANGE', KEYS[1], 0, peek - 1, 'WITHSCORES')) do out[#out + 1] = v end
end
return out
