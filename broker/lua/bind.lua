-- bind: make an agent reachable for one capability (its inbox and the hash of its token).
-- KEYS[1] the capability's agent tokens hash   KEYS[2] inboxes set   KEYS[3] the agent's inbox
-- ARGV[1] agent id   ARGV[2] sha1 of the agent's token
-- Only the token's hash is stored. Returns 1.
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HDEL', KEYS[1], 'draining:' .. ARGV[1])
redis.call('SADD', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[3], 'agents', '0', 'MKSTREAM')
end
return 1
