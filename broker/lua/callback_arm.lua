-- callback_arm: an attempt of an HTTP agent (the worker's HTTP bridge) may end by a callback to
-- the gateway instead of in its HTTP reply (the agent answers 202 and posts the outcome later).
-- Before the request goes out, the worker records the sha256 of the attempt's callback token
-- under the attempt's fence, so that the gateway (callback.lua) takes the current attempt's
-- outcome and refuses a superseded one's.
-- KEYS[1] task hash   KEYS[2] the task's callback hash
-- ARGV[1] fence   ARGV[2] agent id   ARGV[3] sha256 hex of the callback token
-- ARGV[4] how long the callback hash lives (ms: the attempt's timeout and a margin)
-- Returns 'ok', 'gone' (no such task) or 'stale' (the attempt was superseded, or the task is
-- not running).
local f = redis.call('HMGET', KEYS[1], 'state', 'fence', 'agent_id')
if not f[1] then return 'gone' end
if (f[1] ~= 'running' and f[1] ~= 'dispatched') or f[2] ~= ARGV[1] or f[3] ~= ARGV[2] then
  return 'stale'
end
redis.call('HSET', KEYS[2], 't:' .. ARGV[1], ARGV[3])
local ttl = tonumber(ARGV[4])
if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
return 'ok'
