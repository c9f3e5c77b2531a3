-- register: an agent announces itself (idempotent upsert by agent id) and gets a new token.
-- KEYS[1] agents zset (id -> last heartbeat ms)   KEYS[2] the agent's hash
-- KEYS[3] registry event stream   KEYS[4] capabilities set   KEYS[5] changes zset   KEYS[6] rev counter
-- KEYS[7] the set of capabilities an agent ever served
-- ARGV[1] agent id   ARGV[2] sha1 of the new token   ARGV[3] descriptor JSON   ARGV[4] warmup ms
-- ARGV[5] wake channel   ARGV[6] its capabilities' descriptions (JSON, '' for none)
-- then ARGV[7..] the agent's capabilities
-- Re-registering replaces the token, so reports from an older incarnation of the same agent id
-- are refused from now on. Returns the server time of registration (ms).
local now = now_ms()
local agent = ARGV[1]
local existed = redis.call('EXISTS', KEYS[2])
redis.call('HSET', KEYS[2], 'agent_id', agent, 'token_sha', ARGV[2], 'descriptor', ARGV[3],
  'registered_at', jint(now), 'warm_until', jint(now + tonumber(ARGV[4])),
  'last_seen', jint(now), 'mode', 'active', 'stats', '{}')
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[2], 'described', ARGV[6])
else
  redis.call('HDEL', KEYS[2], 'described')
end
redis.call('ZADD', KEYS[1], now, agent)
redis.call('ZADD', KEYS[5], redis.call('INCR', KEYS[6]), agent)
for i = 7, #ARGV do
  redis.call('SADD', KEYS[4], ARGV[i])
  redis.call('SADD', KEYS[7], ARGV[i])
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', 'type', 'registered', 'agent_id', agent,
  'time', jint(now), 'detail', existed == 1 and 're-registered' or '')
wake_agent(ARGV[5], agent)
return now
