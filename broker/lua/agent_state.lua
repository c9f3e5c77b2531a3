-- agent_state: record that an agent's state changed (as a dispatcher judged it from the server
-- clock), once: with several dispatchers only the first to notice writes the event.
-- KEYS[1] the agent's hash   KEYS[2] registry event stream   KEYS[3] changes zset
-- KEYS[4] revision counter
-- ARGV[1] agent id   ARGV[2] the state the caller last knew ('' for none)   ARGV[3] the new state
-- ARGV[4] wake channel
-- Returns 1 if this call recorded the change, 0 if someone else did (or the agent is gone).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local current = redis.call('HGET', KEYS[1], 'state') or ''
if current == ARGV[3] or current ~= ARGV[2] then return 0 end
local now = now_ms()
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'state_since', jint(now))
-- Back from a failure: routing keeps it on light (low-priority) work for cold_start_ms.
if ARGV[3] == 'healthy' and (current == 'suspect' or current == 'offline' or current == 'not_ready') then
  redis.call('HSET', KEYS[1], 'recovered_at', jint(now))
end
redis.call('ZADD', KEYS[3], redis.call('INCR', KEYS[4]), ARGV[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 10000, '*', 'type', 'state', 'agent_id', ARGV[1],
  'time', jint(now), 'detail', (current == '' and 'new' or current) .. ' -> ' .. ARGV[3])
wake_agent(ARGV[4], ARGV[1])
return 1
