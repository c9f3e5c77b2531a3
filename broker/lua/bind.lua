-- bind: make an agent reachable for one capability (its inbox and the hash of its token).
-- KEYS[1] the capability's agent tokens hash   KEYS[2] inboxes set   KEYS[3] the agent's inbox
-- ARGV[1] agent id   ARGV[2] sha1 of the agent's token
-- Only the token's hash is stored. Returns 1.
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HDEL', KEYS[1], DRAINING .. ARGV[1])
redis.call('SADD', KEYS[2], ARGV[1])
-- The inbox and its group (also when the stream exists without the group, e.g. after an
-- entry was added to a deleted inbox: dispatchers count on the group being there).
pcall(redis.call, 'XGROUP', 'CREATE', KEYS[3], AGENT_GROUP, '0', 'MKSTREAM')
return 1
