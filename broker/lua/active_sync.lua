-- active_sync: set a capability's count of tasks handed out (the stats hash's `active`, held
-- against max_running) to the entries its inboxes hold, exactly; the scripts that add and
-- delete inbox entries keep it between two of these.
-- KEYS[1] inboxes set   KEYS[2] capability stats hash
-- ARGV[1] inbox key prefix (an inbox is that plus an agent id of the set, in this slot)
-- Returns the count.
local total = 0
for _, agent in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  total = total + redis.call('XLEN', ARGV[1] .. agent)
end
redis.call('HSET', KEYS[2], 'active', total)
return total
