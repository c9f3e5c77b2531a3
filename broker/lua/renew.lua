-- renew: a worker extends the leases of the tasks it is running.
-- KEYS[1] the agent's inbox   KEYS[2] agent tokens hash
-- then for task i: KEYS[3+i] task hash
-- ARGV[1] agent id   ARGV[2] agent token   then for task i: ARGV[3+2i] inbox entry id,
-- ARGV[4+2i] fencing token
-- The lease is the idle time of the entry in the consumer group's pending list: claiming one's
-- own entry with min-idle 0 (XCLAIM ... JUSTID) resets it without counting a delivery. A task
-- whose attempt was superseded (reclaimed, canceled, gone) is not renewed, and the worker is told
-- to stop it.
-- Returns {'refused'} for a bad token, else a status per task: 'ok', 'stale', 'canceled', 'gone'.
if not token_ok(KEYS[2], ARGV[1], ARGV[2], nil, 'renew', now_ms()) then return {'refused'} end
local inbox, agent = KEYS[1], ARGV[1]
local out = {}
for i = 0, #KEYS - 3 do
  local entry, fence = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  local f = redis.call('HMGET', KEYS[3 + i], 'state', 'fence', 'agent_id')
  if not f[1] then
    out[#out + 1] = 'gone'
  elseif f[1] == 'canceled' then
    out[#out + 1] = 'canceled'
  elseif (f[1] ~= 'running' and f[1] ~= 'dispatched') or f[2] ~= fence or f[3] ~= agent then
    -- ('dispatched': the agent started it and the record of the start is on its way)
    out[#out + 1] = 'stale'
  else
    local claimed = redis.call('XCLAIM', inbox, AGENT_GROUP, agent, 0, entry, 'JUSTID')
    if #claimed == 1 then out[#out + 1] = 'ok' else out[#out + 1] = 'stale' end
  end
end
return out
