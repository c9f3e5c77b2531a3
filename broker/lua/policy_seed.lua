-- policy_seed: a dispatcher publishes its configured policy for every field not set yet in
-- Redis (a capability's `[capabilities.X]` table, or its fleet-wide settings), and learns
-- where its configuration differs from what Redis holds.
-- KEYS[1] the policy hash   KEYS[2] its history stream
-- ARGV[1] the source to record (the dispatcher's config)   ARGV[2] '1' for a capability's hash
-- ARGV[3] who (the dispatcher)   then field, value pairs
-- Returns {field, the value Redis holds, ...} for the fields set otherwise already.
local key, source, own = KEYS[1], ARGV[1], ARGV[2] == '1'
local now = jint(now_ms())
local out = {}
for i = 4, #ARGV, 2 do
  local field, value = ARGV[i], ARGV[i + 1]
  local set
  if own then set = redis.call('HGET', key, 'own:' .. field) else set = redis.call('HGET', key, field) end
  if not set then
    redis.call('HSET', key, field, value, 'src:' .. field, source)
    if own then redis.call('HSET', key, 'own:' .. field, '1') end
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'field', field, 'old', '', 'new', value,
      'who', ARGV[3], 'at', now, 'change', 'seed')
  else
    local held = redis.call('HGET', key, field) or ''
    if held ~= value then out[#out + 1] = field; out[#out + 1] = held end
  end
end
pack_policy(key)
return out
