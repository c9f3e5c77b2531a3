-- register: an agent announces itself (idempotent upsert by agent id) and gets a new token.
-- KEYS[1] agents zset (id -> last heartbeat ms)   KEYS[2] the agent's hash
-- KEYS[3] registry event stream   KEYS[4] capabilities set   KEYS[5] changes zset   KEYS[6] rev counter
-- KEYS[7] the set of capabilities an agent ever served
-- ARGV[1] agent id   ARGV[2] sha1 of the new token   ARGV[3] descriptor JSON   ARGV[4] warmup ms
-- ARGV[5] wake channel   ARGV[6] its capabilities' descriptions (JSON, '' for none)
-- ARGV[7] the token the caller holds for this id ('' for none)   ARGV[8] offline_after_ms
-- ARGV[9] token ttl ms (0: never expires)   ARGV[10] join proof (hex, '' for none)
-- ARGV[11] who is asking (host and pid, for the record of a refusal)
-- ARGV[12] the fleet's join secret hash: read, never written, so it is not among KEYS, whose
-- keys an ACL user must be able to write (an agent's user may only read it); it shares the
-- registry's hash tag, so it is in KEYS[1]'s slot on a Cluster
-- then ARGV[13..] the agent's capabilities
-- Identity rules, in order: with a join secret set, the proof must match its verifier (sha1 of
-- the proof, compared in constant time); a token revoked for this id is refused; an id that is
-- live (a token and a heartbeat within offline_after_ms) is only taken by the holder of its
-- current token (expired or not: only its holder knows it); an offline id is taken over (the
-- restart case). A refusal is counted on the record (if any) and recorded as an event.
-- Re-registering replaces the token, so reports from an older incarnation of the same agent id
-- are refused from now on. Returns {'ok', server ms} | {'live', ms since its last heartbeat} |
-- {status} with status one of 'revoked', 'secret_required', 'secret_wrong'.
local now = now_ms()
local agent = ARGV[1]

-- Whether two strings of equal length are equal, in time that does not depend on where
-- they differ.
local function same(a, b)
  if #a ~= #b then return false end
  local diff = 0
  for i = 1, #a do diff = bit.bor(diff, bit.bxor(string.byte(a, i), string.byte(b, i))) end
  return diff == 0
end

local function refuse(status, extra)
  if redis.call('HEXISTS', KEYS[2], 'descriptor') == 1 then
    redis.call('HINCRBY', KEYS[2], 'register_refused', 1)
    redis.call('HSET', KEYS[2], 'last_refused_at', jint(now), 'last_refused', status .. ': ' .. ARGV[11])
  end
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', 'type', 'register_refused', 'agent_id', agent,
    'time', jint(now), 'detail', status .. ': ' .. ARGV[11])
  return {status, extra}
end

local verifier = redis.call('HGET', ARGV[12], 'verifier')
if verifier then
  if ARGV[10] == '' then return refuse('secret_required') end
  if not same(redis.sha1hex(ARGV[10]), verifier) then return refuse('secret_wrong') end
end
local f = redis.call('HMGET', KEYS[2], 'token_sha', 'last_seen', 'revoked_sha')
local held = ARGV[7] ~= '' and redis.sha1hex(ARGV[7]) or ''
if f[3] and held ~= '' and same(held, f[3]) then return refuse('revoked') end
local quiet_ms = now - (tonumber(f[2]) or 0)
if f[1] and f[1] ~= '' and quiet_ms < tonumber(ARGV[8]) and not (held ~= '' and same(held, f[1])) then
  return refuse('live', jint(quiet_ms))
end

local existed = redis.call('EXISTS', KEYS[2])
redis.call('HSET', KEYS[2], 'agent_id', agent, 'token_sha', ARGV[2], 'descriptor', ARGV[3],
  'registered_at', jint(now), 'warm_until', jint(now + tonumber(ARGV[4])),
  'last_seen', jint(now), 'mode', 'active', 'stats', '{}')
redis.call('HDEL', KEYS[2], 'revoked_sha', 'revoked_at')
if tonumber(ARGV[9]) > 0 then
  redis.call('HSET', KEYS[2], 'token_exp', jint(now + tonumber(ARGV[9])))
else
  redis.call('HDEL', KEYS[2], 'token_exp')
end
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[2], 'described', ARGV[6])
else
  redis.call('HDEL', KEYS[2], 'described')
end
redis.call('ZADD', KEYS[1], now, agent)
redis.call('ZADD', KEYS[5], redis.call('INCR', KEYS[6]), agent)
for i = 13, #ARGV do
  redis.call('SADD', KEYS[4], ARGV[i])
  redis.call('SADD', KEYS[7], ARGV[i])
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', 'type', 'registered', 'agent_id', agent,
  'time', jint(now), 'detail', existed == 1 and 're-registered' or '')
wake_agent(ARGV[5], agent)
return {'ok', now}
