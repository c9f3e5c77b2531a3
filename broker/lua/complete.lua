-- complete: an agent reports how its tasks ended; results are stored and inbox entries
-- acknowledged in one step, guarded by each attempt's fencing token.
-- KEYS[1] the agent's inbox   KEYS[2] delayed zset   KEYS[3] dead-letter stream
-- KEYS[4] capability event feed   KEYS[5] agent tokens hash   KEYS[6] agent health hash
-- KEYS[7] ready queue zset   KEYS[8] pulls hash   KEYS[9] capability stats hash
-- KEYS[10] grants list   KEYS[11] granted hash (see grant.lua)
-- then KEYS[12+i] the task hash of task i
-- ARGV[1] agent id   ARGV[2] agent token   ARGV[3] feed maxlen   ARGV[4] channel prefix
-- ARGV[5] result ttl ms   ARGV[6] capability   ARGV[7] latency ceiling ms (0: none)
-- ARGV[8] the highest priority a cold agent's pull may take (cold_start_max_priority)
-- ARGV[9] task key prefix ("<capability base>:task:")
-- then for task i, 6 values from ARGV[10+6i]: inbox entry id, fencing token, outcome
--   ('success', 'invalid_request', 'failure', 'bad_result', 'retryable_failure'),
--   body (result JSON on success, else the error text), retry backoff ms, execution ms
-- A report from a superseded attempt changes nothing but leaves a `late_result_rejected` event.
-- A report of an attempt whose start was not recorded yet (the agent starts a task as soon as
-- it reads it and records starts in batches, so a quick task may end first; or an accept was
-- lost in a failover) records the start first: the attempt is counted and `accepted` precedes
-- the outcome, timed when the task started.
-- The agent health hash keeps, per agent, what routing needs: consecutive failures and the time
-- of the last one (circuit breaker), the last success (affinity), consecutive tasks over the
-- latency ceiling (ejection). An invalid request is the request's fault and counts for neither.
--
-- Pull (BullMQ's worker fetches its next job as it reports the last one): while tasks wait in
-- the ready queue, an agent holding a standing pull (`P:{cap}:pulls`, field agent id:
-- `most unread|round|score|low`, written by the dispatchers for the healthy agents whose
-- circuit is closed) takes the next ones from the queue's front into its inbox here, one per
-- slot this call freed, never past its inbox limit: the level of work the dispatcher gave it
-- is kept, without a dispatcher round per completion. It stops at the first task with routing
-- constraints (those the dispatcher places) and, for a cold agent (`low` = '1'), at the first
-- task above the cold start priority. An agent that failed or was slow last, or is draining,
-- pulls nothing: the dispatcher decides about it. A pulled task's record names the pull
-- (`explain`: `round|pull|score|`). The task keys are built from data: ARGV[9] .. local id,
-- in this capability's slot.
--
-- Quiet completion, and credits: while the ready queue is empty, a call whose every report is
-- a success within the latency ceiling, from an agent without failures before it and whose
-- grant stands (the granted hash names it: the dispatchers read its load before their next
-- round, see dispatcher/capability.py), changed nothing a dispatcher acts on but the agent's
-- load. It publishes nothing (a wake-up per task was most of a dispatcher's work at low load),
-- and it gives back one grant (its agent's standing one) for each of its tasks that came by
-- grant: the slot that grant promised is free again. So a steady trickle of tasks goes
-- producer -> agent -> producer with no dispatcher round at all. Only a task that came by
-- grant returns one, so an agent holds no more grants than the room it was granted (a task
-- granted under the set before returns its grant to the set now, which was sized while that
-- task still took its room), and the returned grants die with the set. (A set written from
-- loads read just before submits took grants of the set before is off by those tasks, and its
-- credits keep it so, until the next rewrite, a third of the grants' TTL at most; submit's
-- check of the inbox limit holds either way.)
--
-- Returns {'REFUSED'} for a bad token, else {inbox length, inbox pending, tasks pulled,
-- status...} with a status per task: 'ok', 'failed', 'retry', 'stale', 'canceled', 'dup', 'gone'.
local c = context(KEYS[4], ARGV[3], ARGV[4], ARGV[5])
local inbox, agent = KEYS[1], ARGV[1]
if not token_ok(KEYS[5], agent, ARGV[2], c, 'complete') then return {'REFUSED'} end
local n = #KEYS - 11
local health, ceiling = KEYS[6], tonumber(ARGV[7])
local now = now_ms()
local now_s = jint(now)
local token_sha = nil
local statuses = {}
local entries = {}
local timed, timed_ms = 0, 0  -- attempts that ran to an end here, and their execution time
-- Health changes of this call, in order: failures since the last success (or all of them), and
-- likewise slow tasks.
local succeeded, failures, failed_any = false, 0, false
local oks, by_grant = 0, 0  -- successes, and those of tasks that came by grant (credits)
local slow_reset, slow, slow_any = false, 0, false

for i = 0, n - 1 do
  local a = 10 + 6 * i
  local entry, fence, outcome, body = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local exec_ms = ARGV[a + 5]
  local task_key = KEYS[12 + i]
  entries[i + 1] = entry
  local f = redis.call('HMGET', task_key, 'state', 'fence', 'agent_id', 'attempt', 'max_attempts',
    'seq', 'w', 'd', 'id', 'dispatched_at', 'reason', 'error', 'explain')
  local state = f[1]
  local mine = f[2] == fence and f[3] == agent
  local status
  if not state then
    status = 'gone'
  elseif mine and state == 'canceled' then
    status = 'canceled'
  elseif mine and state ~= 'running' and state ~= 'dispatched' then
    -- This very report was applied already (the call was retried after a lost reply). Every
    -- hand-over to another attempt (dispatch, reclaim) moves the fence, so this is not a late one.
    status = 'dup'
  elseif not mine or (state ~= 'running' and state ~= 'dispatched') then
    local t = load_task(task_key, {'fence'})
    event(c, t, 'late_result_rejected', agent, now,
      '{"fence":' .. jint(fence) .. ',"current_fence":' .. jint(t.fence) .. ',"outcome":' .. jstr(outcome) .. '}')
    save(t)
    status = 'stale'
  elseif outcome == 'success' and not f[11] and not f[12] then
    -- The common report, a success with no earlier failure to clear: its fields are named in
    -- the call (a table to unpack cost about 15 % of a task's time in dispatch.lua). A task
    -- that ended before its start was recorded gets the start and `accepted` first.
    local seq, attempt = tonumber(f[6]) or 0, tonumber(f[4]) or 0
    local done_data = '{"exec_ms":' .. jint(exec_ms) .. '}'
    if state == 'dispatched' then
      token_sha = token_sha or redis.sha1hex(ARGV[2])
      local started_s = jint(math.max(now - (tonumber(exec_ms) or 0), tonumber(f[10]) or 0))
      local attempt_s = tostring(attempt + 1)
      local seq1, accepted = new_event(c, f[9], seq, attempt_s, f[7], 'accepted', agent, started_s, '{}')
      local seq2, text = new_event(c, f[9], seq + 1, attempt_s, f[7], 'succeeded', agent, now_s, done_data)
      redis.call('HSET', task_key, 'attempt', attempt_s, 'started_at', started_s,
        'accepted_by', token_sha, 'e:' .. seq1, accepted, 'state', 'succeeded', 'result', body,
        'finished_at', now_s, 'exec_ms', exec_ms, 'e:' .. seq2, text, 'seq', seq2)
    else
      local seq1, text = new_event(c, f[9], seq, tostring(attempt), f[7], 'succeeded', agent, now_s, done_data)
      redis.call('HSET', task_key, 'state', 'succeeded', 'result', body, 'finished_at', now_s,
        'exec_ms', exec_ms, 'e:' .. seq1, text, 'seq', seq1)
    end
    finish(c, task_key, f[8], succeeded_outcome(body))
    status = 'ok'
  else
    local h = {}
    local seq, attempt = tonumber(f[6]) or 0, tonumber(f[4]) or 0
    if state == 'dispatched' then
      token_sha = token_sha or redis.sha1hex(ARGV[2])
      local started_s = jint(math.max(now - (tonumber(exec_ms) or 0), tonumber(f[10]) or 0))
      attempt = attempt + 1
      -- (its state is set by the outcome below, in the same HSET, or first on a failure)
      h = {'attempt', tostring(attempt), 'started_at', started_s, 'accepted_by', token_sha}
      seq = add_event(h, c, f[9], seq, attempt, f[7], 'accepted', agent, started_s, '{}')
    end
    local k = #h
    if outcome == 'success' then
      h[k + 1] = 'state'; h[k + 2] = 'succeeded'; h[k + 3] = 'result'; h[k + 4] = body
      h[k + 5] = 'finished_at'; h[k + 6] = now_s; h[k + 7] = 'exec_ms'; h[k + 8] = exec_ms
      -- (Here an earlier attempt's reason or error is cleared: a success with neither took
      -- the branch above. A first attempt has neither: two fields fewer to write and keep.)
      if f[11] then h[#h + 1] = 'reason'; h[#h + 1] = '' end
      if f[12] then h[#h + 1] = 'error'; h[#h + 1] = '' end
      seq = add_event(h, c, f[9], seq, attempt, f[7], 'succeeded', agent, now_s,
        '{"exec_ms":' .. jint(exec_ms) .. '}')
      k = #h
      h[k + 1] = 'seq'; h[k + 2] = seq
      redis.call('HSET', task_key, unpack(h))
      finish(c, task_key, f[8], succeeded_outcome(body))
      status = 'ok'
    elseif outcome == 'retryable_failure' and attempt < (tonumber(f[5]) or 1) then
      local backoff = tonumber(ARGV[a + 4])
      h[k + 1] = 'state'; h[k + 2] = 'retrying'; h[k + 3] = 'error'; h[k + 4] = body
      h[k + 5] = 'last_agent_id'; h[k + 6] = agent
      seq = add_event(h, c, f[9], seq, attempt, f[7], 'retry_scheduled', agent, now_s,
        '{"delay_ms":' .. jint(backoff) .. ',"error":' .. jstr(body) .. '}')
      k = #h
      h[k + 1] = 'seq'; h[k + 2] = seq
      redis.call('HSET', task_key, unpack(h))
      redis.call('ZADD', KEYS[2], now + backoff, string.match(f[9], ':(.*)$'))
      status = 'retry'
    else
      if k > 0 then
        h[k + 1] = 'state'; h[k + 2] = 'running'; h[k + 3] = 'seq'; h[k + 4] = seq
        redis.call('HSET', task_key, unpack(h))  -- (the start, recorded first)
      end
      local reason = outcome
      if outcome == 'retryable_failure' then reason = 'retries_exhausted' end
      fail_task(c, load_task(task_key, {'state'}), KEYS[3], reason, body, agent, now)
      status = 'failed'
    end
  end
  if status == 'ok' then
    succeeded, failures = true, 0
    oks = oks + 1
    -- (`round|why|score|eligible`: only `why` can read 'grant'; a plain find, on a drain's path)
    if f[13] and string.find(f[13], '|grant|', 1, true) then by_grant = by_grant + 1 end
  elseif (status == 'failed' or status == 'retry') and outcome ~= 'invalid_request' then
    failures, failed_any = failures + 1, true
  end
  if status == 'ok' or status == 'failed' or status == 'retry' then
    timed = timed + 1
    timed_ms = timed_ms + (tonumber(exec_ms) or 0)
    if ceiling > 0 then
      if tonumber(exec_ms) > ceiling then
        slow, slow_any = slow + 1, true
      else
        slow_reset, slow = true, 0
      end
    end
  end
  statuses[i + 1] = status
end

if n > 0 then
  redis.call('XACK', inbox, 'agents', unpack(entries))
  redis.call('XDEL', inbox, unpack(entries))
end

-- A pull needs a success that left no failure after it (the agent's circuit is closed); whether
-- its failures were at 0 before as well decides below whether the dispatchers need to hear.
local pull, cf_before = nil, nil
local all_ok = n > 0 and oks == n
if succeeded and failures == 0 then
  pull = redis.call('HGET', KEYS[8], agent)
  if pull or all_ok then cf_before = redis.call('HGET', health, 'cf:' .. agent) end
end
local cf
if succeeded then
  cf = failures
  redis.call('HSET', health, 'cf:' .. agent, failures, 'ok:' .. agent, now_s)
elseif failures > 0 then
  cf = redis.call('HINCRBY', health, 'cf:' .. agent, failures)
else
  cf = redis.call('HGET', health, 'cf:' .. agent) or '0'
end
if failed_any then redis.call('HSET', health, 'lf:' .. agent, now_s) end
if slow_reset then
  redis.call('HSET', health, 'cs:' .. agent, slow)
elseif slow > 0 then
  redis.call('HINCRBY', health, 'cs:' .. agent, slow)
end
if slow_any then redis.call('HSET', health, 'ls:' .. agent, now_s) end

local len, pending = inbox_load(inbox)
local pulled = 0
if pull and ceiling > 0 and tonumber(redis.call('HGET', health, 'cs:' .. agent) or '0') > 0 then
  pull = nil
end
if pull and redis.call('HEXISTS', KEYS[5], 'draining:' .. agent) == 1 then pull = nil end
if pull then
  local most, round, score, low = string.match(pull, '^(%d+)|([^|]*)|([^|]*)|([^|]*)$')
  local room = 0
  if most then room = math.min(timed, tonumber(most) - (len - pending)) end
  local low_max = tonumber(ARGV[8])
  local why = (round or '') .. '|pull|' .. (score or '') .. '|'
  local head = {}
  if room > 0 then head = redis.call('ZRANGE', KEYS[7], 0, room - 1, 'WITHSCORES') end
  for i = 1, #head, 2 do
    local local_id = head[i]
    local steps = math.floor((tonumber(head[i + 1]) % 1) * 32 + 0.5)  -- (see queue_score)
    if steps % 2 == 1 or (low == '1' and math.floor(steps / 2) - 1 > low_max) then break end
    redis.call('ZREM', KEYS[7], local_id)
    local task_key = ARGV[9] .. local_id
    local f = redis.call('HMGET', task_key, unpack(DELIVERY_FIELDS))
    local deadline = tonumber(f[7]) or 0
    if f[1] ~= 'queued' then
      -- (a queued id whose record says otherwise: nothing to deliver, as in dispatch.lua)
    elseif deadline > 0 and now >= deadline then
      fail_task(c, load_task(task_key, {'state'}), KEYS[3], 'expired',
        'deadline passed while queued', nil, now)
    else
      deliver(c, task_key, f, {}, inbox, agent, local_id, now_s, why, ',"pull":true')
      pulled = pulled + 1
    end
  end
  if pulled > 0 then
    len = len + pulled
    redis.call('HINCRBY', KEYS[9], 'dispatched', pulled)
    redis.call('HINCRBY', KEYS[9], 'pulled', pulled)
  end
end
flush_feed(c)

-- A quiet completion (see the top): give the grants back and tell nobody.
local quiet = false
if all_ok and not slow_any and pulled == 0 and (cf_before or '0') == '0'
    and redis.call('ZCARD', KEYS[7]) == 0 then
  local standing = redis.call('HGET', KEYS[11], agent)
  if standing and redis.call('HEXISTS', KEYS[5], 'draining:' .. agent) == 0 then
    quiet = true
    if by_grant > 0 then
      local credits = {}
      for i = 1, by_grant do credits[i] = standing end
      redis.call('RPUSH', KEYS[10], unpack(credits))
      -- (a list that submits emptied is gone, and its expiry with it: it dies with the set)
      if redis.call('PTTL', KEYS[10]) < 0 then
        redis.call('PEXPIRE', KEYS[10], math.max(1, redis.call('PTTL', KEYS[11])))
      end
    end
  end
end

-- The dispatchers keep each agent's load and health from these messages. A call that refilled
-- every slot it freed, after and before a success, changed neither (its inbox holds as many
-- entries as before): nothing to tell, and no dispatcher wakes for it; nor for a quiet one.
if not quiet and not (pulled > 0 and pulled == timed and (cf_before or '0') == '0') then
  redis.call('PUBLISH', ARGV[4] .. 'wake',
    'free ' .. ARGV[6] .. ' ' .. agent .. ' ' .. len .. ' ' .. pending .. ' ' .. cf .. ' ' ..
    timed .. ' ' .. jint(timed_ms) .. ' ' .. pulled)
end
local out = {len, pending, pulled}
for _, s in ipairs(statuses) do out[#out + 1] = s end
return out
