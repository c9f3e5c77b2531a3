-- unbind: take an agent off a capability (the counterpart of bind.lua), when it leaves for good
-- (a drained worker) or is pruned: its token no longer opens the capability's scripts, and its
-- inbox goes unless entries still wait there (release.lua hands those on first).
-- KEYS[1] the capability's agent tokens hash   KEYS[2] inboxes set   KEYS[3] the agent's inbox
-- ARGV[1] agent id
-- Returns 1 when the inbox went with it, 0 when entries kept it.
redis.call('HDEL', KEYS[1], ARGV[1], DRAINING .. ARGV[1])
if redis.call('XLEN', KEYS[3]) > 0 then return 0 end
redis.call('DEL', KEYS[3])
redis.call('SREM', KEYS[2], ARGV[1])
return 1
