-- token_renew: an agent moves its token's expiry on before it passes (the registry's side;
-- each capability's side is bind.lua in renewal mode).
-- KEYS[1] the agent's hash   KEYS[2] registry event stream
-- ARGV[1] agent id   ARGV[2] token   ARGV[3] token ttl ms
-- An expired token is not renewed (the agent registers again). Returns {'ok', new expiry ms}
-- | {'refused'} | {'unknown'} | {'revoked'}.
local agent = ARGV[1]
local f = redis.call('HMGET', KEYS[1], 'token_sha', 'token_exp', 'revoked_sha')
local now = now_ms()
local sha = ARGV[2] ~= '' and redis.sha1hex(ARGV[2]) or ''
if f[3] and sha == f[3] then return {'revoked'} end
if not f[1] then return {'unknown'} end
local expired = sha == f[1] and f[2] and tonumber(f[2]) <= now
if sha == '' or f[1] ~= sha or expired then
  redis.call('HINCRBY', KEYS[1], 'refused', 1)
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', 10000, '*', 'type', 'token_refused',
    'agent_id', agent, 'time', jint(now), 'detail', expired and 'renewal (expired)' or 'renewal')
  return {'refused'}
end
local exp = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'token_exp', jint(exp))
return {'ok', exp}
