-- bind: make an agent reachable for one capability (its inbox and the hash of its token), or
-- renew its token's expiry there.
-- KEYS[1] the capability's agent tokens hash   KEYS[2] inboxes set   KEYS[3] the agent's inbox
-- ARGV[1] agent id   ARGV[2] sha1 of the agent's token   ARGV[3] token ttl ms (0 or '': it never
-- expires)   ARGV[4] '1' to renew only: the expiry moves only if this token is still the one
-- bound (a token revoked or replaced meanwhile is never bound again by a renewal)
-- Only the token's hash is stored; its expiry is this node's clock plus the ttl.
-- Returns 1, or 0 when a renewal found another token (or none) bound.
local ttl = tonumber(ARGV[3]) or 0
if ARGV[4] == '1' then
  if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
  if ttl > 0 then redis.call('HSET', KEYS[1], TOKEN_EXP .. ARGV[1], jint(now_ms() + ttl)) end
  return 1
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ttl > 0 then
  redis.call('HSET', KEYS[1], TOKEN_EXP .. ARGV[1], jint(now_ms() + ttl))
else
  redis.call('HDEL', KEYS[1], TOKEN_EXP .. ARGV[1])
end
redis.call('HDEL', KEYS[1], DRAINING .. ARGV[1])
redis.call('SADD', KEYS[2], ARGV[1])
-- The inbox and its group (also when the stream exists without the group, e.g. after an
-- entry was added to a deleted inbox: dispatchers count on the group being there).
pcall(redis.call, 'XGROUP', 'CREATE', KEYS[3], AGENT_GROUP, '0', 'MKSTREAM')
return 1
