-- reclaim: hand on tasks whose lease lapsed (their agent died, froze, lost the network or went
-- offline). The dispatcher first claims the lapsed inbox entries for itself (XAUTOCLAIM), then
-- calls this to requeue each task as a new attempt, atomically.
-- KEYS[1] the agent's inbox   KEYS[2] queue zset   KEYS[3] dead-letter stream
-- KEYS[4] capability event feed   KEYS[5] agent health hash (a lapsed lease is a failure of
-- the agent, for its circuit breaker)   KEYS[6] capability stats hash   KEYS[7] policy hash
-- then KEYS[8+i] the task hash of task i
-- ARGV[1] the inbox's agent id   ARGV[2] the dispatcher's consumer name   ARGV[3] policy defaults
-- ARGV[4] feed maxlen   ARGV[5] task channel prefix   ARGV[6] result ttl ms   ARGV[7] capability
-- ARGV[8] reason   ARGV[9] wake channel
-- then for task i: ARGV[10+2i] inbox entry id, ARGV[11+2i] its fencing token
-- An entry the agent renewed since (claimed back: its owner is the agent again) is left alone.
-- The fence moves, so anything the old attempt reports later is refused. A task that already
-- used all its attempts fails with retries_exhausted.
-- Returns {requeued, failed, skipped}.
local c = context(KEYS[4], ARGV[4], ARGV[5], ARGV[6], KEYS[6])
local inbox, agent, me = KEYS[1], ARGV[1], ARGV[2]
local p = load_policy(KEYS[7], ARGV[3])
local aging = tonumber(p.aging)
local n = #KEYS - 7
local now = now_ms()
local requeued, failed, skipped = 0, 0, 0
for i = 0, n - 1 do
  local entry, fence = ARGV[10 + 2 * i], ARGV[11 + 2 * i]
  local pending = redis.call('XPENDING', inbox, AGENT_GROUP, entry, entry, 1)
  if #pending == 0 or pending[1][2] ~= me then
    skipped = skipped + 1
  else
    redis.call('XACK', inbox, AGENT_GROUP, entry)
    count(c, STAT_REMOVED, redis.call('XDEL', inbox, entry))
    local t = load_task(KEYS[8 + i], {'state', 'fence', 'agent_id', 'priority', 'max_attempts'})
    if (t.state == 'running' or t.state == 'dispatched') and t.fence == fence and t.agent_id == agent then
      local was = t.state
      if was == 'dispatched' then
        -- Read but its start not recorded: agents start what they read at once and record
        -- starts a moment later, so count the attempt now. (Else a task that kills its agent
        -- at once would never use up its attempts.)
        start_attempt(c, t, agent, '', now)
      end
      set(t, 'fence', (tonumber(t.fence) or 0) + 1)
      redis.call('HINCRBY', KEYS[5], 'cf:' .. agent, 1)
      redis.call('HSET', KEYS[5], 'lf:' .. agent, jint(now))
      local attempt, most = tonumber(t.attempt) or 0, tonumber(t.max_attempts) or tonumber(p.max_attempts)
      local data = '{"reason":' .. jstr(ARGV[8]) .. ',"read":true,"was":' .. jstr(was) .. '}'
      event(c, t, 'reclaimed', agent, now, data)
      count(c, STAT_RECLAIMS, 1)
      if attempt >= most then
        fail_task(c, t, KEYS[3], 'retries_exhausted',
          ARGV[8] .. ' on the last attempt (' .. attempt .. ' of ' .. most .. ')', agent, now)
        failed = failed + 1
      else
        set(t, 'state', 'queued')
        set(t, 'queued_at', jint(now))
        set(t, 'agent_id', '')
        set(t, 'last_agent_id', agent)
        event(c, t, 'queued', nil, now, '{"priority":' .. jint(t.priority) .. '}')
        save(t)
        -- (constrained: the next attempt avoids this agent when another can take it)
        redis.call('ZADD', KEYS[2], queue_score(now, tonumber(t.priority) or 5, aging, true),
          string.match(t.id, ':(.*)$'))
        requeued = requeued + 1
      end
    else
      skipped = skipped + 1
    end
  end
end
flush_feed(c)
if requeued > 0 then wake_task(ARGV[9], ARGV[7]) end
return {requeued, failed, skipped}
