-- The stand-in agents finished everything in their inboxes at once: empty each inbox and, where
-- that removed something, say so as Reach's complete script does (`free <cap> <agent> 0 0`).
-- Nothing was read through the group, so nothing is pending.
-- KEYS: the inboxes; ARGV[1] wake channel, ARGV[2] capability, then the agent id of each inbox.
-- Returns how many entries were removed.
local removed = 0
for i = 1, #KEYS do
  local n = redis.call('XTRIM', KEYS[i], 'MAXLEN', 0)
  if n > 0 then
    removed = removed + n
    redis.call('PUBLISH', ARGV[1], 'free ' .. ARGV[2] .. ' ' .. ARGV[2 + i] .. ' 0 0')
  end
end
return removed
