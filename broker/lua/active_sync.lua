-- active_sync: make a capability's count of tasks handed out (held against max_running: the
-- stats hash's counters tell it, see active_count in _policy.lua) the entries its inboxes hold,
-- exactly, by adding the difference to its `removed` counter; the scripts that add and delete
-- inbox entries keep it between two of these.
-- KEYS[1] inboxes set   KEYS[2] capability stats hash
-- ARGV[1] inbox key prefix (an inbox is that plus an agent id of the set, in this slot)
-- Returns the count.
local total = 0
for _, agent in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  total = total + redis.call('XLEN', ARGV[1] .. agent)
end
local drift = active_count(KEYS[2]) - total
if drift ~= 0 then redis.call('HINCRBY', KEYS[2], STAT_REMOVED, drift) end
return total
