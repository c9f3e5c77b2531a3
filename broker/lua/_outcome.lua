-- How one attempt's report changes its task (complete.lua): success, a retry after a backoff,
-- or failure into the dead-letter stream; a report of a superseded attempt only leaves a
-- `late_result_rejected` event. `f` is the record as complete.lua reads it (OUTCOME_FIELDS).
-- A report of an attempt whose start was not recorded yet (the agent starts a task as soon as
-- it reads it and records starts in batches, so a quick task may end first; or an accept was
-- lost in a failover) records the start first: the attempt is counted and `accepted` precedes
-- the outcome, timed when the task started.
local OUTCOME_FIELDS = {'state', 'fence', 'agent_id', 'attempt', 'max_attempts', 'seq', 'w', 'd',
                        'id', 'dispatched_at', 'reason', 'error', 'explain'}

-- When the attempt started, by the server clock: its report's time less its execution time,
-- never before its dispatch.
local function started_at(r, f)
  return jint(math.max(r.now - (tonumber(r.exec_ms) or 0), tonumber(f[10]) or 0))
end

-- The common report, a success with no earlier failure to clear: its fields are named in the
-- call (a table to unpack cost about 15 % of a task's time in dispatch.lua).
local function plain_success(c, r, task_key, f)
  local seq, attempt = tonumber(f[6]) or 0, tonumber(f[4]) or 0
  local done_data = '{"exec_ms":' .. jint(r.exec_ms) .. '}'
  if f[1] == 'dispatched' then
    local started_s = started_at(r, f)
    local attempt_s = tostring(attempt + 1)
    local seq1, accepted = new_event(c, f[9], seq, attempt_s, f[7], 'accepted', r.agent, started_s, '{}')
    local seq2, text = new_event(c, f[9], seq + 1, attempt_s, f[7], 'succeeded', r.agent, r.now_s, done_data)
    redis.call('HSET', task_key, 'attempt', attempt_s, 'started_at', started_s,
      'accepted_by', r.token_sha(), 'e:' .. seq1, accepted, 'state', 'succeeded', 'result', r.body,
      'finished_at', r.now_s, 'exec_ms', r.exec_ms, 'e:' .. seq2, text, 'seq', seq2)
  else
    local seq1, text = new_event(c, f[9], seq, tostring(attempt), f[7], 'succeeded', r.agent, r.now_s, done_data)
    redis.call('HSET', task_key, 'state', 'succeeded', 'result', r.body, 'finished_at', r.now_s,
      'exec_ms', r.exec_ms, 'e:' .. seq1, text, 'seq', seq1)
  end
  finish(c, task_key, f[8], succeeded_outcome(r.body), f[7], f[9])
  return 'ok'
end

-- Any other report of the current attempt: a success that clears an earlier attempt's error,
-- a retry (while attempts are left), or a failure.
local function other_outcome(c, r, task_key, f, dlq, delayed)
  local h = {}
  local seq, attempt = tonumber(f[6]) or 0, tonumber(f[4]) or 0
  if f[1] == 'dispatched' then
    attempt = attempt + 1
    -- (its state is set by the outcome below, in the same HSET, or first on a failure)
    h = {'attempt', tostring(attempt), 'started_at', started_at(r, f), 'accepted_by', r.token_sha()}
    seq = add_event(h, c, f[9], seq, attempt, f[7], 'accepted', r.agent, h[4], '{}')
  end
  local k = #h
  if r.outcome == 'success' then
    h[k + 1] = 'state'; h[k + 2] = 'succeeded'; h[k + 3] = 'result'; h[k + 4] = r.body
    h[k + 5] = 'finished_at'; h[k + 6] = r.now_s; h[k + 7] = 'exec_ms'; h[k + 8] = r.exec_ms
    if f[11] then h[#h + 1] = 'reason'; h[#h + 1] = '' end
    if f[12] then h[#h + 1] = 'error'; h[#h + 1] = '' end
    seq = add_event(h, c, f[9], seq, attempt, f[7], 'succeeded', r.agent, r.now_s,
      '{"exec_ms":' .. jint(r.exec_ms) .. '}')
    h[#h + 1] = 'seq'; h[#h + 1] = seq
    redis.call('HSET', task_key, unpack(h))
    finish(c, task_key, f[8], succeeded_outcome(r.body), f[7], f[9])
    return 'ok'
  elseif r.outcome == 'retryable_failure' and attempt < (tonumber(f[5]) or tonumber(r.policy().max_attempts)) then
    h[k + 1] = 'state'; h[k + 2] = 'retrying'; h[k + 3] = 'error'; h[k + 4] = r.body
    h[k + 5] = 'last_agent_id'; h[k + 6] = r.agent
    seq = add_event(h, c, f[9], seq, attempt, f[7], 'retry_scheduled', r.agent, r.now_s,
      '{"delay_ms":' .. jint(r.backoff) .. ',"error":' .. jstr(r.body) .. '}')
    h[#h + 1] = 'seq'; h[#h + 1] = seq
    redis.call('HSET', task_key, unpack(h))
    redis.call('ZADD', delayed, r.now + (tonumber(r.backoff) or 0), string.match(f[9], ':(.*)$'))
    return 'retry'
  end
  if k > 0 then
    h[k + 1] = 'state'; h[k + 2] = 'running'; h[k + 3] = 'seq'; h[k + 4] = seq
    redis.call('HSET', task_key, unpack(h))  -- (the start, recorded first)
  end
  local reason = r.outcome
  if r.outcome == 'retryable_failure' then reason = 'retries_exhausted' end
  fail_task(c, load_task(task_key, {'state'}), dlq, reason, r.body, r.agent, r.now)
  return 'failed'
end

-- Apply one report `r` (agent, fence, outcome, body, backoff, exec_ms, now, now_s, token_sha(),
-- policy(): the capability's, whose max_attempts holds for a task that names none)
-- to its task; returns its status ('ok', 'failed', 'retry', 'stale', 'canceled', 'dup', 'gone')
-- and the record as read (OUTCOME_FIELDS).
local function apply_outcome(c, r, task_key, dlq, delayed)
  local f = redis.call('HMGET', task_key, unpack(OUTCOME_FIELDS))
  local state = f[1]
  local mine = f[2] == r.fence and f[3] == r.agent
  if not state then
    return 'gone', f
  elseif mine and state == 'canceled' then
    return 'canceled', f
  elseif mine and state ~= 'running' and state ~= 'dispatched' then
    -- This very report was applied already (the call was retried after a lost reply). Every
    -- hand-over to another attempt (dispatch, reclaim) moves the fence, so this is not a late one.
    return 'dup', f
  elseif not mine or (state ~= 'running' and state ~= 'dispatched') then
    local t = load_task(task_key, {'fence'})
    event(c, t, 'late_result_rejected', r.agent, r.now,
      '{"fence":' .. jint(r.fence) .. ',"current_fence":' .. jint(t.fence) .. ',"outcome":' ..
      jstr(r.outcome) .. '}')
    save(t)
    return 'stale', f
  elseif r.outcome == 'success' and not f[11] and not f[12] then
    return plain_success(c, r, task_key, f), f
  end
  return other_outcome(c, r, task_key, f, dlq, delayed), f
end
