-- promote: move delayed tasks whose time has come (retries after their backoff, scheduled
-- tasks at their start time) into the ready queue.
-- KEYS[1] delayed zset   KEYS[2] queue zset   KEYS[3] capability event feed   KEYS[4] policy hash
-- then KEYS[5+i] the task hash of task i
-- ARGV[1] policy defaults   ARGV[2] feed maxlen   ARGV[3] task channel prefix   ARGV[4] capability
-- ARGV[5] wake channel   then ARGV[6+i] local id of task i
-- A task that is no longer due (or no longer delayed) is left alone.
-- Returns the number of tasks promoted.
local c = context(KEYS[3], ARGV[2], ARGV[3], 0)
local aging = tonumber(load_policy(KEYS[4], ARGV[1]).aging)
local n = #KEYS - 4
local now = now_ms()
local promoted = 0
for i = 0, n - 1 do
  local local_id = ARGV[6 + i]
  local due = tonumber(redis.call('ZSCORE', KEYS[1], local_id))
  if due and due <= now then
    redis.call('ZREM', KEYS[1], local_id)
    local t = load_task(KEYS[5 + i], {'state', 'priority', 'session_id', 'region', 'routing', 'last_agent_id'})
    if t.state == 'retrying' or t.state == 'scheduled' then
      set(t, 'state', 'queued')
      set(t, 'queued_at', jint(now))
      event(c, t, 'queued', nil, now, '{"priority":' .. jint(t.priority) .. '}')
      save(t)
      redis.call('ZADD', KEYS[2], queue_score(now, tonumber(t.priority) or 5, aging,
        constrained(t.session_id, t.region, t.routing, t.last_agent_id)), local_id)
      promoted = promoted + 1
    end
  end
end
flush_feed(c)
if promoted > 0 then wake_task(ARGV[5], ARGV[4]) end
return promoted
