-- release: put tasks that sit unread in an agent's inbox back into the ready queue, because
-- the agent went offline or is draining. Entries the agent has already read are left alone
-- (they are running, or their lease will lapse and reclaim.lua hands them on).
-- KEYS[1] the agent's inbox   KEYS[2] queue zset   KEYS[3] capability event feed
-- then for task i: KEYS[4+2i] task hash, KEYS[5+2i] task events
-- ARGV[1] agent id   ARGV[2] aging ms   ARGV[3] feed maxlen   ARGV[4] channel prefix
-- ARGV[5] capability   ARGV[6] reason (e.g. "agent offline")
-- then for task i: ARGV[7+2i] inbox entry id, ARGV[8+2i] fencing token of that entry
-- Returns the number of tasks put back.
local c = {feed = KEYS[3], feed_maxlen = tonumber(ARGV[3]), chan = ARGV[4], ttl = 0}
local inbox, agent, aging = KEYS[1], ARGV[1], tonumber(ARGV[2])
local n = (#KEYS - 3) / 2
local now = now_ms()
local released = 0
for i = 0, n - 1 do
  local task_key, events_key = KEYS[4 + 2 * i], KEYS[5 + 2 * i]
  local entry, fence = ARGV[7 + 2 * i], ARGV[8 + 2 * i]
  -- Read by the agent in the meantime? Then it is not ours to move.
  local pending = redis.call('XPENDING', inbox, 'agents', entry, entry, 1)
  if #pending == 0 and #redis.call('XRANGE', inbox, entry, entry) == 1 then
    redis.call('XDEL', inbox, entry)
    local f = redis.call('HMGET', task_key, 'state', 'fence', 'agent_id', 'priority', 'id')
    if f[1] == 'dispatched' and f[2] == fence and f[3] == agent then
      redis.call('HINCRBY', task_key, 'fence', 1)
      redis.call('HSET', task_key, 'state', 'queued', 'queued_at', jint(now), 'agent_id', '')
      local local_id = string.match(f[5], ':(.*)$')
      redis.call('ZADD', KEYS[2], now - (tonumber(f[4]) or 5) * aging, local_id)
      emit(c, task_key, events_key, 'reclaimed', agent, now,
        '{"reason":' .. jstr(ARGV[6]) .. ',"read":false}')
      emit(c, task_key, events_key, 'queued', nil, now, '{"priority":' .. jint(f[4]) .. '}')
      released = released + 1
    end
  end
end
if released > 0 then redis.call('PUBLISH', ARGV[4] .. 'wake', 'task ' .. ARGV[5]) end
return released
