-- The stand-in agents finished what they read: acknowledge and delete it, and say so as Reach's
-- complete script does (`free <cap> <agent> <inbox len> <pending>`), one wake-up per inbox.
-- KEYS: the inboxes read from; ARGV[1] wake channel, ARGV[2] capability, then per inbox: its
-- agent id, its entry count k, then its k entry ids. (Everything read is acknowledged, so
-- nothing stays pending.)
local a = 3
for i = 1, #KEYS do
  local agent, k = ARGV[a], tonumber(ARGV[a + 1])
  local ids = {unpack(ARGV, a + 2, a + 1 + k)}
  redis.call('XACK', KEYS[i], 'agents', unpack(ids))
  redis.call('XDEL', KEYS[i], unpack(ids))
  local len = redis.call('XLEN', KEYS[i])
  redis.call('PUBLISH', ARGV[1], 'free ' .. ARGV[2] .. ' ' .. agent .. ' ' .. len .. ' 0')
  a = a + 2 + k
end
return #KEYS
