-- cancel: end a task that has not finished, wherever it is.
-- KEYS[1] queue zset   KEYS[2] delayed zset   KEYS[3] task hash   KEYS[4] capability event feed
-- KEYS[5] the inbox of the agent the caller saw holding the task ('' key name for none)
-- KEYS[6] capability stats hash   KEYS[7] canceled tasks zset (local id -> when, for `reach tasks`)
-- ARGV[1] local id   ARGV[2] feed maxlen   ARGV[3] task channel prefix   ARGV[4] result ttl ms
-- ARGV[5] the agent the caller saw holding the task ('' for none)   ARGV[6] that agent's control
-- channel
-- A queued or delayed task is removed from its set. A dispatched one that its agent has not
-- read yet is removed from the inbox, so it never starts (agents start what they read at once);
-- a dispatched or running one is marked so its agent drops it (the agent is told on its control
-- channel, and any result it reports later is discarded).
-- Returns {'gone'} | {'terminal', state} | {'canceled', previous state} | {'moved', agent}
-- when the task is now with another agent than the caller said (call again with that one).
local c = context(KEYS[4], ARGV[2], ARGV[3], ARGV[4], KEYS[6])
local t = load_task(KEYS[3], {'state', 'agent_id', 'entry'})
local state = t.state
if not state then return {'gone'} end
if state == 'succeeded' or state == 'failed' or state == 'canceled' then
  return {'terminal', state}
end
local agent = t.agent_id or ''
if (state == 'dispatched' or state == 'running') and agent ~= ARGV[5] then
  return {'moved', agent}
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if state == 'dispatched' and t.entry then
  -- Unread? Then take it out of the inbox. (Read ones stay: the agent finishes them off.)
  if #redis.call('XPENDING', KEYS[5], AGENT_GROUP, t.entry, t.entry, 1) == 0 then
    count(c, STAT_REMOVED, redis.call('XDEL', KEYS[5], t.entry))
  end
end
local now = now_ms()
set(t, 'state', 'canceled')
set(t, 'finished_at', jint(now))
set(t, 'reason', 'canceled')
count(c, STAT_CANCELED, 1)
event(c, t, 'canceled', t.agent_id, now, '{"previous_state":' .. jstr(state) .. '}')
save(t)
redis.call('ZADD', KEYS[7], now, ARGV[1])
if (state == 'dispatched' or state == 'running') and agent ~= '' then
  redis.call('PUBLISH', ARGV[6], 'cancel ' .. t.id)
end
finish(c, t._key, t.d, ended_outcome('canceled', 'canceled', nil), t.w, t.id)
flush_feed(c)
return {'canceled', state}
