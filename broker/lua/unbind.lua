-- unbind: take an agent off a capability (the counterpart of bind.lua), when it leaves for good
-- (a drained worker), is pruned or is revoked: its token no longer opens the capability's
-- scripts, and its inbox goes unless entries still wait there (release.lua hands those on
-- first) or the caller keeps it.
-- KEYS[1] the capability's agent tokens hash   KEYS[2] inboxes set   KEYS[3] the agent's inbox
-- ARGV[1] agent id   ARGV[2] '1' to keep the inbox (a revoked agent: its process, still
-- running, must not find the inbox gone and bind it again; the prune removes it later)
-- Returns 1 when the inbox went with it, 0 when entries (or the caller) kept it.
redis.call('HDEL', KEYS[1], ARGV[1], TOKEN_EXP .. ARGV[1], DRAINING .. ARGV[1])
if ARGV[2] == '1' or redis.call('XLEN', KEYS[3]) > 0 then return 0 end
redis.call('DEL', KEYS[3])
redis.call('SREM', KEYS[2], ARGV[1])
return 1
