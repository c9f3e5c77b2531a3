-- How a task ends: its record kept for the result TTL, its waiters woken, and for a failure
-- its dead letter. fail_task is the one place a task's dead letter is written
-- (dead_letter_raw.lua parks entries that are no task at all).

-- A task reached a terminal state (its changes saved): keep the record for the result TTL, and
-- wake the waiters that registered with the outcome (JSON): pushed to its done list (`d`), which
-- they block on with BLMOVE done done (that wakes every waiter and leaves the list as it was);
-- published on its channel (`w`, '1' or 'o'), so that a waiter needs no read after the wake-up.
-- `w` and `id`: the record's fields.
local function finish(c, key, d, outcome, w, id)
  redis.call('PEXPIRE', key, c.ttl)
  if d == '1' then
    local done = key .. DONE_SUFFIX
    redis.call('DEL', done)
    redis.call('RPUSH', done, outcome)
    redis.call('PEXPIRE', done, math.min(c.ttl, DONE_TTL_MS))
  end
  if w and id then redis.call('PUBLISH', c.chan .. id, DONE_MESSAGE .. outcome) end
end

local function succeeded_outcome(body)
  if #body <= DONE_RESULT_MAX then return '{"state":"succeeded","result":' .. body .. '}' end
  return '{"state":"succeeded"}'
end

local function ended_outcome(state, reason, err)
  return '{"state":' .. jstr(state) .. ',"reason":' .. jstr(reason) .. ',"error":' .. jstr(err) .. '}'
end

-- Move a task to its terminal `failed` state and park it in the dead-letter stream with its
-- whole record and history, so it can be inspected and replayed even after the record expires.
local function fail_task(c, t, dlq_key, reason, err, agent, now)
  set(t, 'state', 'failed')
  set(t, 'reason', reason)
  set(t, 'error', err or '')
  set(t, 'finished_at', jint(now))
  count(c, STAT_FAILED .. reason, 1)
  local data = '{"reason":' .. jstr(reason) .. ',"error":' .. jstr(err) .. '}'
  if reason == 'expired' then event(c, t, 'expired', agent, now, data) end
  event(c, t, 'failed', agent, now, data)
  event(c, t, 'dead_lettered', agent, now, data)
  save(t)
  local flat = redis.call('HGETALL', t._key)
  local record, events, seqs = {}, {}, {}
  for i = 1, #flat, 2 do
    local name = flat[i]
    local seq = string.sub(name, 1, 2) == 'e:' and tonumber(string.sub(name, 3))
    if seq then
      events[seq] = flat[i + 1]
      seqs[#seqs + 1] = seq
    else
      record[name] = flat[i + 1]
    end
  end
  -- (the events held, in order: seqs have gaps where progress events were dropped)
  table.sort(seqs)
  local history = {}
  for _, seq in ipairs(seqs) do
    history[#history + 1] = event_json(seq, events[seq], record['id'], trace_id_of(record['trace']))
  end
  redis.call('XADD', dlq_key, '*',
    'task_id', record['id'] or '', 'reason', reason, 'error', err or '',
    'attempts', record['attempt'] or '0', 'last_agent_id', agent or record['agent_id'] or '',
    'dead_at', jint(now), 'record', cjson.encode(record),
    'history', '[' .. table.concat(history, ',') .. ']')
  finish(c, t._key, t.d, ended_outcome('failed', reason, err), t.w, t.id)
end
