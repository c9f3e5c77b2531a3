-- policy_sync: copy the fleet's policy into a capability's policy hash, for every field the
-- capability does not set itself, so that the scripts, which read only the capability's hash
-- (one Cluster slot), follow the fleet's defaults (broker/policy.py).
-- KEYS[1] the capability's policy hash
-- then ARGV: field, value, source triples (value '': the built-in default, which the caller
-- passes as the value)
-- Returns how many fields changed.
local key = KEYS[1]
local changed = 0
for i = 1, #ARGV, 3 do
  local field, value, source = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if not redis.call('HGET', key, 'own:' .. field) then
    if redis.call('HGET', key, field) ~= value then
      redis.call('HSET', key, field, value, 'src:' .. field, source)
      changed = changed + 1
    elseif redis.call('HGET', key, 'src:' .. field) ~= source then
      redis.call('HSET', key, 'src:' .. field, source)
    end
  end
end
pack_policy(key)
return changed
