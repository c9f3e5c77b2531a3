-- no_agent: fail the queued tasks of a capability that no agent could take for its no-agent
-- timeout. The capability has had no agent able to take work (healthy or warming) since the
-- stats hash's `unserved_since` (a dispatcher sets it when it sees none and clears it when one
-- comes), and each task has been waiting in the queue since before the cutoff. A backlog that
-- live agents work through never fails here: only a capability nobody serves.
-- KEYS[1] queue zset   KEYS[2] dead-letter stream   KEYS[3] capability event feed
-- KEYS[4] capability stats hash   then KEYS[5+i] the task hash of task i
-- ARGV[1] feed maxlen   ARGV[2] task channel prefix   ARGV[3] result ttl ms
-- ARGV[4] the no-agent timeout ms   then ARGV[5+i] the local id of task i
-- Returns how many tasks failed.
local c = context(KEYS[3], ARGV[1], ARGV[2], ARGV[3], KEYS[4])
local nat = tonumber(ARGV[4])
local now = now_ms()
local cutoff = now - nat
local since = tonumber(redis.call('HGET', KEYS[4], 'unserved_since'))
if nat <= 0 or not since or since > cutoff then return 0 end
local failed = 0
for i = 5, #KEYS do
  local local_id = ARGV[i]
  local t = load_task(KEYS[i], {'state', 'queued_at', 'fence'})
  if t.state == 'queued' and (tonumber(t.queued_at) or 0) <= cutoff then
    redis.call('ZREM', KEYS[1], local_id)
    set(t, 'fence', (tonumber(t.fence) or 0) + 1)
    fail_task(c, t, KEYS[2], 'no_agent_timeout',
      'no agent could take the task for ' .. nat .. ' ms', nil, now)
    failed = failed + 1
  end
end
flush_feed(c)
return failed
