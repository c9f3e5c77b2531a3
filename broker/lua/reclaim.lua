-- reclaim: hand on tasks whose lease lapsed (their agent died, froze, lost the network or went
-- offline). The dispatcher first claims the lapsed inbox entries for itself (XAUTOCLAIM), then
-- calls this to requeue each task as a new attempt, atomically.
-- KEYS[1] the agent's inbox   KEYS[2] queue zset   KEYS[3] dead-letter stream
-- KEYS[4] capability event feed   KEYS[5] agent health hash (a lapsed lease is a failure of
-- the agent, for its circuit breaker)
-- then for task i: KEYS[6+3i] task hash, KEYS[7+3i] task events, KEYS[8+3i] task done list
-- ARGV[1] the inbox's agent id   ARGV[2] the dispatcher's consumer name   ARGV[3] aging ms
-- ARGV[4] feed maxlen   ARGV[5] channel prefix   ARGV[6] result ttl ms   ARGV[7] capability
-- ARGV[8] reason   then for task i: ARGV[9+2i] inbox entry id, ARGV[10+2i] its fencing token
-- An entry the agent renewed since (claimed back: its owner is the agent again) is left alone.
-- The fence moves, so anything the old attempt reports later is refused. A task that already
-- used all its attempts fails with retries_exhausted.
-- Returns {requeued, failed, skipped}.
local c = {feed = KEYS[4], feed_maxlen = tonumber(ARGV[4]), chan = ARGV[5], ttl = tonumber(ARGV[6])}
local inbox, agent, me, aging = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local n = (#KEYS - 5) / 3
local now = now_ms()
local requeued, failed, skipped = 0, 0, 0
for i = 0, n - 1 do
  local task_key, events_key, done_key = KEYS[6 + 3 * i], KEYS[7 + 3 * i], KEYS[8 + 3 * i]
  local entry, fence = ARGV[9 + 2 * i], ARGV[10 + 2 * i]
  local pending = redis.call('XPENDING', inbox, 'agents', entry, entry, 1)
  if #pending == 0 or pending[1][2] ~= me then
    skipped = skipped + 1
  else
    redis.call('XACK', inbox, 'agents', entry)
    redis.call('XDEL', inbox, entry)
    local f = redis.call('HMGET', task_key, 'state', 'fence', 'agent_id', 'priority', 'id',
      'attempt', 'max_attempts')
    if (f[1] == 'running' or f[1] == 'dispatched') and f[2] == fence and f[3] == agent then
      redis.call('HINCRBY', task_key, 'fence', 1)
      if f[1] == 'running' then
        redis.call('HINCRBY', KEYS[5], 'cf:' .. agent, 1)
        redis.call('HSET', KEYS[5], 'lf:' .. agent, jint(now))
      end
      local attempt, most = tonumber(f[6]) or 0, tonumber(f[7]) or 1
      local data = '{"reason":' .. jstr(ARGV[8]) .. ',"read":true,"was":' .. jstr(f[1]) .. '}'
      if f[1] == 'running' and attempt >= most then
        emit(c, task_key, events_key, 'reclaimed', agent, now, data)
        fail_task(c, task_key, events_key, done_key, KEYS[3], 'retries_exhausted',
          ARGV[8] .. ' on the last attempt (' .. attempt .. ' of ' .. most .. ')', agent, now)
        failed = failed + 1
      else
        redis.call('HSET', task_key, 'state', 'queued', 'queued_at', jint(now), 'agent_id', '',
          'last_agent_id', agent)
        local local_id = string.match(f[5], ':(.*)$')
        redis.call('ZADD', KEYS[2], now - (tonumber(f[4]) or 5) * aging, local_id)
        emit(c, task_key, events_key, 'reclaimed', agent, now, data)
        emit(c, task_key, events_key, 'queued', nil, now, '{"priority":' .. jint(f[4]) .. '}')
        requeued = requeued + 1
      end
    else
      skipped = skipped + 1
    end
  end
end
if requeued > 0 then redis.call('PUBLISH', ARGV[5] .. 'wake', 'task ' .. ARGV[7]) end
return {requeued, failed, skipped}
