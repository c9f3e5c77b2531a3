-- cancel: end a task that has not finished, wherever it is.
-- KEYS[1] queue zset   KEYS[2] delayed zset   KEYS[3] task hash   KEYS[4] task events
-- KEYS[5] capability event feed   KEYS[6] task done list
-- ARGV[1] local id   ARGV[2] feed maxlen   ARGV[3] channel prefix   ARGV[4] result ttl ms
-- A queued or delayed task is removed from its set; a dispatched or running one is marked so its
-- agent drops it (the agent is told on its control channel, and any result it reports later is
-- discarded).
-- Returns {'gone'} | {'terminal', state} | {'canceled', previous state}.
local c = {feed = KEYS[5], feed_maxlen = tonumber(ARGV[2]), chan = ARGV[3], ttl = tonumber(ARGV[4])}
local f = redis.call('HMGET', KEYS[3], 'state', 'agent_id', 'id')
local state = f[1]
if not state then return {'gone'} end
if state == 'succeeded' or state == 'failed' or state == 'canceled' then
  return {'terminal', state}
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local now = now_ms()
redis.call('HSET', KEYS[3], 'state', 'canceled', 'finished_at', jint(now), 'reason', 'canceled')
emit(c, KEYS[3], KEYS[4], 'canceled', f[2], now, '{"previous_state":' .. jstr(state) .. '}')
if (state == 'dispatched' or state == 'running') and f[2] and f[2] ~= '' then
  redis.call('PUBLISH', ARGV[3] .. 'ctl:' .. f[2], 'cancel ' .. f[3])
end
finish(c, KEYS[3], KEYS[4], KEYS[6], 'canceled')
return {'canceled', state}
