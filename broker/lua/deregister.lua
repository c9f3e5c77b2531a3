-- deregister: an agent leaves the fleet for good (after draining).
-- KEYS[1] agents zset   KEYS[2] the agent's hash   KEYS[3] registry event stream
-- KEYS[4] changes zset   KEYS[5] revision counter
-- ARGV[1] agent id   ARGV[2] token   ARGV[3] wake channel
-- Returns 'ok' | 'refused' | 'unknown'.
local agent = ARGV[1]
local sha = redis.call('HGET', KEYS[2], 'token_sha')
local now = now_ms()
if not sha then return 'unknown' end
if ARGV[2] == '' or sha ~= redis.sha1hex(ARGV[2]) then
  redis.call('HINCRBY', KEYS[2], 'refused', 1)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', 'type', 'token_refused',
    'agent_id', agent, 'time', jint(now), 'detail', 'deregister')
  return 'refused'
end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[1], agent)
redis.call('ZADD', KEYS[4], redis.call('INCR', KEYS[5]), agent)
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', 'type', 'deregistered', 'agent_id', agent,
  'time', jint(now), 'detail', '')
wake_agent(ARGV[3], agent)
return 'ok'
