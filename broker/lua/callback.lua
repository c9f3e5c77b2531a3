-- callback: the gateway takes the outcome an HTTP agent posts for an attempt it accepted
-- (POST /v1/callbacks/{task id}), fenced like any report: only the current attempt's callback
-- is taken. The outcome is kept in the callback hash and the agent's worker is told on its
-- control channel (`callback <task id>`); the worker reports it as that attempt's outcome, so
-- the task moves on through the usual report (and its fence is checked there once more).
-- KEYS[1] task hash   KEYS[2] the task's callback hash
-- ARGV[1] the fence the token names   ARGV[2] sha256 hex of the token   ARGV[3] the outcome (JSON)
-- ARGV[4] the agents' control channel prefix   ARGV[5] task id
-- Returns 'ok'; 'dup' (this attempt's outcome was taken already); 'refused' (no attempt of the
-- task was given this token); 'stale' (its attempt was superseded, or the task is not running
-- any more); 'gone' (no such task).
-- (The token is compared as its sha256: a timing difference tells nothing of the token.)
local f = redis.call('HMGET', KEYS[1], 'state', 'fence', 'agent_id')
if not f[1] then return 'gone' end
local armed = redis.call('HMGET', KEYS[2], 't:' .. ARGV[1], 'o:' .. ARGV[1])
if armed[1] ~= ARGV[2] then return 'refused' end
if f[2] ~= ARGV[1] or (f[1] ~= 'running' and f[1] ~= 'dispatched') then return 'stale' end
if armed[2] then return 'dup' end
redis.call('HSET', KEYS[2], 'o:' .. ARGV[1], ARGV[3])
redis.call('PUBLISH', ARGV[4] .. (f[3] or ''), 'callback ' .. ARGV[5])
return 'ok'
