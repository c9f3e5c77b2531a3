-- heartbeat: an agent proves it is alive and reports how it is doing.
-- KEYS[1] agents zset   KEYS[2] the agent's hash   KEYS[3] registry event stream
-- KEYS[4] changes zset (agent -> revision)   KEYS[5] revision counter
-- ARGV[1] agent id   ARGV[2] token   ARGV[3] stats JSON   ARGV[4] mode ('' keeps it, else
-- 'active' or 'draining')   ARGV[5] wake channel   ARGV[6] '1' when the numbers moved enough
-- for routing to care (then the record's revision moves and dispatchers re-read it)
-- The time of the beat is the Redis server's, so a skewed agent clock changes nothing. Readers
-- find changed records through the changes zset instead of re-reading every agent.
-- A wrong or expired token is refused, counted and recorded. Returns {'ok', server ms} |
-- {'refused'} | {'unknown'} | {'revoked'} (the operator revoked this very token).
local agent = ARGV[1]
local f = redis.call('HMGET', KEYS[2], 'token_sha', 'mode', 'token_exp', 'revoked_sha')
local now = now_ms()
local sha = ARGV[2] ~= '' and redis.sha1hex(ARGV[2]) or ''
if f[4] and sha == f[4] then return {'revoked'} end
if not f[1] then return {'unknown'} end
local expired = sha == f[1] and f[3] and tonumber(f[3]) <= now
if sha == '' or f[1] ~= sha or expired then
  redis.call('HINCRBY', KEYS[2], 'refused', 1)
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', 'type', 'token_refused',
    'agent_id', agent, 'time', jint(now), 'detail', expired and 'heartbeat (expired)' or 'heartbeat')
  return {'refused'}
end
redis.call('HSET', KEYS[2], 'last_seen', jint(now))
redis.call('ZADD', KEYS[1], now, agent)
local changed = ARGV[6] == '1'
if ARGV[3] ~= '' then redis.call('HSET', KEYS[2], 'stats', ARGV[3]) end
if ARGV[4] ~= '' and ARGV[4] ~= f[2] then
  changed = true
  redis.call('HSET', KEYS[2], 'mode', ARGV[4])
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', 'type', 'mode', 'agent_id', agent,
    'time', jint(now), 'detail', ARGV[4])
  wake_agent(ARGV[5], agent)
end
if changed then redis.call('ZADD', KEYS[4], redis.call('INCR', KEYS[5]), agent) end
return {'ok', now}
