-- promote: move delayed tasks whose time has come back into the ready queue.
-- KEYS[1] delayed zset   KEYS[2] queue zset   KEYS[3] capability event feed
-- then for task i: KEYS[4+2i] task hash, KEYS[5+2i] task events
-- ARGV[1] aging ms   ARGV[2] feed maxlen   ARGV[3] channel prefix   ARGV[4] capability
-- then ARGV[5+i] local id of task i
-- A task that is no longer due (or no longer delayed) is left alone.
-- Returns the number of tasks promoted.
local c = {feed = KEYS[3], feed_maxlen = tonumber(ARGV[2]), chan = ARGV[3], ttl = 0}
local aging = tonumber(ARGV[1])
local n = (#KEYS - 3) / 2
local now = now_ms()
local promoted = 0
for i = 0, n - 1 do
  local task_key, events_key, local_id = KEYS[4 + 2 * i], KEYS[5 + 2 * i], ARGV[5 + i]
  local due = tonumber(redis.call('ZSCORE', KEYS[1], local_id))
  if due and due <= now then
    redis.call('ZREM', KEYS[1], local_id)
    local f = redis.call('HMGET', task_key, 'state', 'priority')
    if f[1] == 'retrying' or f[1] == 'delayed' then
      redis.call('HSET', task_key, 'state', 'queued', 'queued_at', jint(now))
      redis.call('ZADD', KEYS[2], now - (tonumber(f[2]) or 5) * aging, local_id)
      emit(c, task_key, events_key, 'queued', nil, now, '{"priority":' .. jint(f[2]) .. '}')
      promoted = promoted + 1
    end
  end
end
if promoted > 0 then
  redis.call('PUBLISH', ARGV[3] .. 'wake', 'task ' .. ARGV[4])
end
return promoted
