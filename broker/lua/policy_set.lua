-- policy_set: change fields of a policy (a capability's, or the fleet's defaults), recording
-- each change (who, when, old -> new) in the policy's history, and tell the dispatchers.
-- KEYS[1] the policy hash   KEYS[2] its history stream
-- ARGV[1] 'set' or 'reset'   ARGV[2] who   ARGV[3] the source to record (broker/policy.py
-- Source)   ARGV[4] wake channel   ARGV[5] the capability ('*' for the fleet's)
-- ARGV[6] '1' for a capability's hash (its own fields are marked `own:<field>`)
-- then field, value pairs: for 'set' the new value; for 'reset' of a capability's field the
-- fleet's value it falls back to (with that value's source after a '|': value|source), and
-- for 'reset' of the fleet's field '' (the built-in default then applies)
-- Returns {field, old, new, ...} for every field whose value changed.
local key, mode, who, source = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local own = ARGV[6] == '1'
local now = jint(now_ms())
local out = {}
for i = 7, #ARGV, 2 do
  local field, value = ARGV[i], ARGV[i + 1]
  local old = redis.call('HGET', key, field) or ''
  local new, src = value, source
  if mode == 'reset' then
    local sep = string.find(value, '|', 1, true)
    if sep then new, src = string.sub(value, 1, sep - 1), string.sub(value, sep + 1) else new, src = value, '' end
    if own then redis.call('HDEL', key, 'own:' .. field) end
  elseif own then
    redis.call('HSET', key, 'own:' .. field, '1')
  end
  if new == '' then
    redis.call('HDEL', key, field, 'src:' .. field)
  else
    redis.call('HSET', key, field, new, 'src:' .. field, src)
  end
  if old ~= new then
    out[#out + 1] = field; out[#out + 1] = old; out[#out + 1] = new
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'field', field, 'old', old, 'new', new,
      'who', who, 'at', now, 'change', mode)
  end
end
pack_policy(key)
if #out > 0 then wake_policy(ARGV[4], ARGV[5]) end
return out
