-- submit: create one or more tasks and make them ready, atomically: each is queued, handed
-- straight to an agent by a grant while nothing waits in the queue (see _handoff.lua), or, with
-- a delay or a start time, scheduled (in the delayed zset until due: promote.lua).
-- KEYS[1] queue zset   KEYS[2] capability event feed   KEYS[3] intake stream
-- KEYS[4] deadlines zset (when to look at a task with a deadline)
-- KEYS[5] grants list   KEYS[6] agent tokens hash   KEYS[7] capability stats hash
-- KEYS[8] granted hash (the standing grant set by agent, and '#': how many were written)
-- KEYS[9] policy hash   KEYS[10] rate bucket   KEYS[11] delayed zset
-- KEYS[12] the capability's task index (zset local id -> created ms, for `reach tasks`)
-- then for each task its hash, followed by its idempotency key when it has one
-- ARGV[1] policy defaults (see _policy.lua)   ARGV[2] idempotency ttl ms   ARGV[3] feed maxlen
-- ARGV[4] task channel prefix   ARGV[5] capability   ARGV[6] inbox key prefix (an inbox is
-- that plus the agent id a grant names, in this capability's slot)
-- ARGV[7] the highest priority a grant for low-priority tasks only may take (cold_start_max_priority)
-- ARGV[8] wake channel
-- then for task i: 7 values from ARGV[9+7i]: task id, local id, payload, priority, trace
--   context (the record's `trace`: traceparent[ tracestate], broker/protocol/trace.py),
--   '1' when the producer will wait for the result (then the outcome is pushed to its done
--   list), and its options: '' for none, else a JSON object of text values
--   (broker/protocol/submit.py SubmitRequest.options_arg), any of: session_id, region,
--   idempotency_key, timeout_ms
--   (absent: the policy's), deadline_ms, metadata (JSON), max_attempts (absent: the policy's),
--   routing (JSON), intake_entry (an entry taken from the intake stream, acknowledged and
--   deleted in the same step, so a crash never creates a task twice), delay_ms, at_ms.
-- Returns {'full', depth} when the queue cannot take the batch, else for each task
-- {'new'|'dup', task id} flattened.
local c = context(KEYS[2], ARGV[3], ARGV[4], 0)
local queue, stats = KEYS[1], KEYS[7]
local p = load_policy(KEYS[9], ARGV[1])
local max_depth, aging = tonumber(p.max_depth), nil
local idem_ttl = tonumber(ARGV[2])
local n = (#ARGV - 8) / 7
local wake, cap = ARGV[8], ARGV[5]
local g = nil  -- (the grants' keys, made only when grants stand: see below)
local NONE = {}

local depth = redis.call('ZCARD', queue)
if depth + n > max_depth then
  return {'full', depth}
end
-- Tasks go straight to agents only while the queue is empty, so none passes a waiting one; and
-- never while the capability is paused, past its rate, or at its max_running.
local granted = (depth == 0 and not p.paused) and redis.call('LLEN', KEYS[5]) or 0
local direct_ok = granted > 0
local room = direct_ok and room_to_run(stats, p) or 0
local loads = nil
if direct_ok then
  g = {grants = KEYS[5], granted = KEYS[8], tokens = KEYS[6], inbox_prefix = ARGV[6],
       low_max = tonumber(ARGV[7])}
  loads = {}
end

local now = now_ms()
local now_s = jint(now)
local out = {}
local queued, direct, created = 0, 0, 0
local k = 13
local indexed = {}  -- (score, local id) pairs: one ZADD for the whole call
for i = 0, n - 1 do
  local a = 9 + 7 * i
  local task_id, local_id, payload, priority_s, trace = ARGV[a], ARGV[a + 1], ARGV[a + 2],
    ARGV[a + 3], ARGV[a + 4]
  local o = ARGV[a + 6] == '' and NONE or cjson.decode(ARGV[a + 6])
  local session, region, idem, routing = o.session_id or '', o.region or '', o.idempotency_key or '',
    o.routing or ''
  local task_key, idem_key = KEYS[k], false
  k = k + 1
  if idem ~= '' then idem_key = KEYS[k]; k = k + 1 end
  local existing = false
  if redis.call('EXISTS', task_key) == 1 then
    existing = task_id  -- the same call retried after a lost reply: no second task
  elseif idem_key then
    -- The first task with this key wins for the whole TTL, even after its record expired:
    -- running it again would break the promise the key makes.
    existing = redis.call('GET', idem_key)
  end
  if existing then
    out[#out + 1] = 'dup'
    out[#out + 1] = existing
  else
    local priority = tonumber(priority_s)
    local deadline_at = '0'
    if o.deadline_ms then deadline_at = jint(now + tonumber(o.deadline_ms)) end
    local h = {'v', '2', 'id', task_id, 'cap', cap, 'payload', payload, 'priority', priority_s,
               'deadline_at', deadline_at, 'trace', trace, 'attempt', '0', 'fence', '0',
               'created_at', now_s, 'queued_at', now_s}
    -- (options not given are left out of the record: a missing field reads as empty; the
    -- timeout and the attempts allowed then come from the policy when they matter)
    if o ~= NONE then
      if o.timeout_ms then h[#h + 1] = 'timeout_ms'; h[#h + 1] = o.timeout_ms end
      if o.max_attempts then h[#h + 1] = 'max_attempts'; h[#h + 1] = o.max_attempts end
      if session ~= '' then h[#h + 1] = 'session_id'; h[#h + 1] = session end
      if region ~= '' then h[#h + 1] = 'region'; h[#h + 1] = region end
      if idem ~= '' then h[#h + 1] = 'idempotency_key'; h[#h + 1] = idem end
      if o.metadata then h[#h + 1] = 'metadata'; h[#h + 1] = o.metadata end
      if routing ~= '' then h[#h + 1] = 'routing'; h[#h + 1] = routing end
    end
    if ARGV[a + 5] == '1' then h[#h + 1] = 'd'; h[#h + 1] = '1' end
    local due = tonumber(o.at_ms or 0)
    if due <= 0 and o.delay_ms then due = now + tonumber(o.delay_ms) end
    local grant = nil
    if due > now then
      -- Scheduled: it waits in the delayed zset until due (promote.lua queues it then).
      local seq = add_event(h, c, task_id, 0, '0', false, 'scheduled', nil, now_s,
        '{"at":' .. jint(due) .. ',"priority":' .. priority_s .. '}')
      h[#h + 1] = 'state'; h[#h + 1] = 'scheduled'; h[#h + 1] = 'due_at'; h[#h + 1] = jint(due)
      h[#h + 1] = 'seq'; h[#h + 1] = seq
      redis.call('HSET', task_key, unpack(h))
      redis.call('ZADD', KEYS[11], due, local_id)
    else
      local seq = add_event(h, c, task_id, 0, '0', false, 'queued', nil, now_s,
        '{"priority":' .. priority_s .. '}')
      if direct_ok and room > 0 and session == '' and region == '' and routing == ''
          and take_tokens(KEYS[10], p, 1, now) == 1 then
        grant = next_grant(g, priority)
        if not grant then give_back_tokens(KEYS[10], p, 1) end
      end
      if grant then
        local why = grant[3] .. '|grant|' .. grant[4] .. '|'  -- (see broker/protocol/grants.py)
        -- (the record as deliver() reads it: DELIVERY_FIELDS)
        local f = {'queued', '0', seq, '0', false, task_id, deadline_at, payload, o.timeout_ms,
                   trace, session, o.metadata, o.max_attempts}
        deliver(c, p, task_key, f, h, grant[2], grant[1], local_id, now_s, why, ',"direct":true')
        local before = loads[grant[1]]
        loads[grant[1]] = {grant[5] + 1, grant[6], (before and before[3] or 0) + 1}
        direct = direct + 1
        room = room - 1
      else
        h[#h + 1] = 'state'; h[#h + 1] = 'queued'; h[#h + 1] = 'seq'; h[#h + 1] = seq
        redis.call('HSET', task_key, unpack(h))
        aging = aging or tonumber(p.aging)
        redis.call('ZADD', queue, queue_score(now, priority, aging,
          constrained(session, region, routing, nil)), local_id)
        direct_ok = false  -- the rest of the batch queues behind this one
        queued = queued + 1
      end
    end
    if deadline_at ~= '0' then redis.call('ZADD', KEYS[4], deadline_at, local_id) end
    if idem_key then
      redis.call('SET', idem_key, task_id, 'PX', idem_ttl)
    end
    indexed[#indexed + 1] = now_s
    indexed[#indexed + 1] = local_id
    out[#out + 1] = 'new'
    out[#out + 1] = task_id
    created = created + 1
  end
  if o.intake_entry then
    redis.call('XACK', KEYS[3], DISPATCH_GROUP, o.intake_entry)
    redis.call('XDEL', KEYS[3], o.intake_entry)
  end
end
flush_feed(c)
for i = 1, #indexed, 1000 do  -- (unpack has a stack limit)
  redis.call('ZADD', KEYS[12], unpack(indexed, i, math.min(i + 999, #indexed)))
end
if queued > 0 then wake_task(wake, cap) end
if created > 0 then redis.call('HINCRBY', stats, STAT_SUBMITTED, created) end
if direct > 0 then
  redis.call('HINCRBY', stats, STAT_DIRECT, direct)
  tell_took(g, wake, cap, granted, loads)
end
return out
