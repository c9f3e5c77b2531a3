-- revoke: an operator cuts an agent off at once (the registry's side; `reach agents revoke`
-- then takes the token off each capability and hands the agent's tasks on).
-- KEYS[1] agents zset   KEYS[2] the agent's hash   KEYS[3] registry event stream
-- KEYS[4] changes zset   KEYS[5] revision counter
-- ARGV[1] agent id   ARGV[2] wake channel   ARGV[3] who revoked it (for the event)
-- The token's hash moves to `revoked_sha`: its holder's heartbeats, renewals and registrations
-- are answered 'revoked' (it stops), and the record reads as offline (broker/registry.py).
-- Returns 'ok' | 'unknown' (no such agent) | 'revoked' (already).
local agent = ARGV[1]
local f = redis.call('HMGET', KEYS[2], 'token_sha', 'revoked_sha', 'descriptor')
if not f[3] then return 'unknown' end
if not f[1] then return f[2] and 'revoked' or 'unknown' end
local now = now_ms()
redis.call('HSET', KEYS[2], 'revoked_sha', f[1], 'revoked_at', jint(now))
redis.call('HDEL', KEYS[2], 'token_sha', 'token_exp')
redis.call('ZADD', KEYS[4], redis.call('INCR', KEYS[5]), agent)
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', 'type', 'revoked', 'agent_id', agent,
  'time', jint(now), 'detail', ARGV[3])
wake_agent(ARGV[2], agent)
return 'ok'
