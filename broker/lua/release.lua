-- release: put tasks that sit unread in an agent's inbox back into the ready queue, because
-- the agent went offline or is draining. Entries the agent has already read are left alone
-- (they are running, or their lease will lapse and reclaim.lua hands them on).
-- KEYS[1] the agent's inbox   KEYS[2] queue zset   KEYS[3] capability event feed
-- KEYS[4] capability stats hash   KEYS[5] policy hash   then KEYS[6+i] the task hash of task i
-- ARGV[1] agent id   ARGV[2] policy defaults   ARGV[3] feed maxlen   ARGV[4] task channel prefix
-- ARGV[5] capability   ARGV[6] reason (e.g. "agent offline")   ARGV[7] wake channel
-- then for task i: ARGV[8+2i] inbox entry id, ARGV[9+2i] fencing token of that entry
-- Returns the number of tasks put back.
local c = context(KEYS[3], ARGV[3], ARGV[4], 0, KEYS[4])
local inbox, agent = KEYS[1], ARGV[1]
local aging = tonumber(load_policy(KEYS[5], ARGV[2]).aging)
local n = #KEYS - 5
local now = now_ms()
local released = 0
for i = 0, n - 1 do
  local entry, fence = ARGV[8 + 2 * i], ARGV[9 + 2 * i]
  -- Read by the agent in the meantime? Then it is not ours to move.
  local pending = redis.call('XPENDING', inbox, AGENT_GROUP, entry, entry, 1)
  if #pending == 0 and #redis.call('XRANGE', inbox, entry, entry) == 1 then
    count(c, STAT_REMOVED, redis.call('XDEL', inbox, entry))
    local t = load_task(KEYS[6 + i], {'state', 'fence', 'agent_id', 'priority', 'session_id', 'region',
      'routing', 'last_agent_id'})
    if t.state == 'dispatched' and t.fence == fence and t.agent_id == agent then
      set(t, 'fence', (tonumber(t.fence) or 0) + 1)
      set(t, 'state', 'queued')
      set(t, 'queued_at', jint(now))
      set(t, 'agent_id', '')
      event(c, t, 'reclaimed', agent, now, '{"reason":' .. jstr(ARGV[6]) .. ',"read":false}')
      count(c, STAT_RECLAIMS, 1)
      event(c, t, 'queued', nil, now, '{"priority":' .. jint(t.priority) .. '}')
      save(t)
      redis.call('ZADD', KEYS[2], queue_score(now, tonumber(t.priority) or 5, aging,
        constrained(t.session_id, t.region, t.routing, t.last_agent_id)), string.match(t.id, ':(.*)$'))
      released = released + 1
    end
  end
end
flush_feed(c)
if released > 0 then wake_task(ARGV[7], ARGV[5]) end
return released
