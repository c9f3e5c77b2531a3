-- Shared helpers, prepended to every script of this folder when it is loaded (broker/scripts.py).
-- Scripts take their keys from KEYS, with two derived names, both in the slot of a key the
-- caller declared: a task's done list is its record's key plus ':done' (done_key below), and
-- submit.lua's direct hand-off builds the inbox a grant names from the inbox prefix it is given.
-- Times come from the Redis server clock (TIME), never from a client.
--
-- A task's events live in its own record: field `seq` counts them and field `e:<n>` holds event
-- n as `type|time ms|attempt|agent id|data JSON` (the task id and trace id are the record's).
-- So an event costs no command of its own: it is two more fields in the HSET that changes the
-- task's state. Waiters register (watch.lua, or submit for its own producer): field `w` while
-- someone follows the task's events (only then are they published on its channel), field `d`
-- while someone blocks on its `done` list (only then is the outcome pushed there).

if redis.replicate_commands then pcall(redis.replicate_commands) end

local DONE_TTL_MS = 60000     -- a done list only wakes waiters that registered before the end
local DONE_RESULT_MAX = 8192  -- results up to this size ride in the done list itself

-- The done list of a task (broker/keys.py, CapabilityKeys.task_done): named after its record.
local function done_key(task_key)
  return task_key .. ':done'
end

-- Run `cmd key args[first..]` in chunks of 1000 arguments (Lua's unpack has a stack limit);
-- an even chunk size keeps field/value pairs together.
local function call_in_chunks(cmd, key, args, first)
  for i = first, #args, 1000 do
    redis.call(cmd, key, unpack(args, i, math.min(i + 999, #args)))
  end
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A JSON string, or null for nil/false/''.
local function jstr(s)
  if s == nil or s == false or s == '' then return 'null' end
  return cjson.encode(s)
end

-- An integer as JSON text (Lua 5.1 numbers are doubles; %d keeps big ms values exact).
local function jint(n)
  return string.format('%d', tonumber(n) or 0)
end

-- What every state change of a script shares: where events go and how long records live.
local function context(feed, feed_maxlen, chan, ttl)
  return {feed = feed, feed_maxlen = tonumber(feed_maxlen) or 0, chan = chan,
          ttl = tonumber(ttl) or 0, lines = {}}
end

-- A task as a script sees it: the fields it asked for plus those that emitting events needs
-- (id, seq, attempt, w, d; missing fields read as false), and the changes it stages (see set).
local function load_task(key, names)
  local all = {'id', 'seq', 'attempt', 'w', 'd'}
  for _, name in ipairs(names) do all[#all + 1] = name end
  local values = redis.call('HMGET', key, unpack(all))
  local t = {_key = key, _set = {}}
  for i, name in ipairs(all) do t[name] = values[i] end
  return t
end

-- Stage a field change; save() writes every staged change in one HSET.
local function set(t, field, value)
  local s = t._set
  s[#s + 1] = field
  s[#s + 1] = value
  t[field] = value
end

local function save(t)
  if t._seq_dirty then
    set(t, 'seq', t.seq)
    t._seq_dirty = false
  end
  if #t._set > 0 then
    redis.call('HSET', t._key, unpack(t._set))
    t._set = {}
  end
end

-- Add an event to the task (staged with its other changes), publish it if someone watches the
-- task, and queue a line for the capability's feed (written once per call by flush_feed).
local add_event
local function event(c, t, etype, agent, now, data)
  t.seq = add_event(t._set, c, t.id or '', tonumber(t.seq) or 0, jint(t.attempt), t.w, etype, agent,
    jint(now), data or '{}')
  t._seq_dirty = true
end

-- Event seq+1 of a task, for the hot paths (submit, dispatch, complete), which write a task's
-- change with explicit HSET arguments or a plain list instead of a task table: publishes it if
-- someone watches the task (w = '1'), queues its line for the feed, and returns seq+1 and the
-- event as text, for the caller to write as fields `seq` and `e:<seq>`. `now_s`: the time as
-- text; `attempt`: as text.
local function new_event(c, id, seq, attempt, w, etype, agent, now_s, data)
  local seq_s = tostring(seq + 1)  -- (once: every number turned into text is a printf)
  local text = etype .. '|' .. now_s .. '|' .. attempt .. '|' .. (agent or '') .. '|' .. data
  if w == '1' then
    redis.call('PUBLISH', c.chan .. 'ev:' .. id, seq_s .. '|' .. text)
  end
  if c.feed_maxlen > 0 then
    c.lines[#c.lines + 1] = id .. '|' .. seq_s .. '|' .. text
  end
  return seq_s, text
end

-- new_event, with its field appended to the HSET arguments `h`; returns seq+1.
function add_event(h, c, id, seq, attempt, w, etype, agent, now_s, data)
  local seq_s, text = new_event(c, id, seq, attempt, w, etype, agent, now_s, data)
  local n = #h
  h[n + 1] = 'e:' .. seq_s
  h[n + 2] = text
  return seq + 1
end

-- A ready task's score in the queue: when it became ready minus priority x aging_ms (higher
-- priority first, and a waiting task gains a level per aging_ms with no rescoring), plus a
-- fraction that carries its priority and whether it has routing constraints (a session, a
-- region, a version, an agent to avoid), so that ZRANGE WITHSCORES is all a dispatcher reads of
-- a plain task (decode_queue_score in dispatcher/routing.py). Scores are whole milliseconds,
-- far below 2^52, so the fraction survives in a double. (Returned as text: Lua would print the
-- number with 14 significant digits, which loses the fraction.)
local function queue_score(now, priority, aging, has_constraints)
  local frac = (priority + 1) / 16
  if has_constraints then frac = frac + 1 / 32 end
  return string.format('%.5f', now - priority * aging + frac)
end

-- Whether a task (its session_id, region, routing, last_agent_id fields) has routing constraints.
local function constrained(session, region, routing, last_agent)
  return (session and session ~= '') or (region and region ~= '') or (routing and routing ~= '')
    or (last_agent and last_agent ~= '') or false
end

-- One feed entry per call, holding every event the call made (one line each).
local function flush_feed(c)
  if #c.lines > 0 then
    redis.call('XADD', c.feed, 'MAXLEN', '~', c.feed_maxlen, '*', 'events', table.concat(c.lines, '\n'))
    c.lines = {}
  end
end

-- A compact event as the JSON object readers get (seq, type, task_id, attempt, agent_id,
-- trace_id, time, data).
local function event_json(seq, text, task_id, trace_id)
  local etype, time, attempt, agent, data = string.match(text, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
  if not etype then return nil end
  return '{"seq":' .. jint(seq) .. ',"type":' .. jstr(etype) .. ',"task_id":' .. jstr(task_id) ..
    ',"attempt":' .. jint(attempt) .. ',"agent_id":' .. jstr(agent) .. ',"trace_id":' ..
    jstr(trace_id) .. ',"time":' .. jint(time) .. ',"data":' .. data .. '}'
end

-- A task reached a terminal state (its changes saved): keep the record for the result TTL, and
-- wake the waiters that registered by pushing the outcome (JSON) to its done list, which they
-- block on with BLMOVE done done (that wakes every waiter and leaves the list as it was).
local function finish(c, key, d, outcome)
  redis.call('PEXPIRE', key, c.ttl)
  if d == '1' then
    local done = done_key(key)
    redis.call('DEL', done)
    redis.call('RPUSH', done, outcome)
    redis.call('PEXPIRE', done, math.min(c.ttl, DONE_TTL_MS))
  end
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
  local data = '{"reason":' .. jstr(reason) .. ',"error":' .. jstr(err) .. '}'
  if reason == 'expired' then event(c, t, 'expired', agent, now, data) end
  event(c, t, 'failed', agent, now, data)
  event(c, t, 'dead_lettered', agent, now, data)
  save(t)
  local flat = redis.call('HGETALL', t._key)
  local record, events = {}, {}
  for i = 1, #flat, 2 do
    local name = flat[i]
    if string.sub(name, 1, 2) == 'e:' then
      events[tonumber(string.sub(name, 3))] = flat[i + 1]
    else
      record[name] = flat[i + 1]
    end
  end
  local history = {}
  for seq = 1, tonumber(record['seq']) or 0 do
    if events[seq] then
      history[#history + 1] = event_json(seq, events[seq], record['id'], record['trace_id'])
    end
  end
  redis.call('XADD', dlq_key, '*',
    'task_id', record['id'] or '', 'reason', reason, 'error', err or '',
    'attempts', record['attempt'] or '0', 'last_agent_id', agent or record['agent_id'] or '',
    'dead_at', jint(now), 'record', cjson.encode(record),
    'history', '[' .. table.concat(history, ',') .. ']')
  finish(c, t._key, t.d, ended_outcome('failed', reason, err))
end

-- Unread entries of an agent's inbox: everything in it minus what the agent already holds.
-- (Finished entries are deleted, so XLEN counts dispatched-and-not-finished exactly.)
local function inbox_load(inbox)
  local len = redis.call('XLEN', inbox)
  local pending = 0
  if len > 0 then
    local ok, summary = pcall(redis.call, 'XPENDING', inbox, 'agents')
    if ok and summary then pending = tonumber(summary[1]) or 0 end
  end
  return len, pending
end

-- What an inbox entry carries besides the task's local id and fence, so that the agent can
-- start the task as soon as it reads it: `p` the payload and `x` the rest, packed as
-- `attempt|timeout ms|deadline at|max attempts|trace id|session id|metadata` (metadata last: it
-- may hold '|'). A payload over INBOX_PAYLOAD_MAX is left out: the agent then accepts the task
-- first, which reads it from the record.
local INBOX_PAYLOAD_MAX = 16384
-- The record fields deliver() needs, in the order it reads them (f[1] state ... f[13]).
local DELIVERY_FIELDS = {'state', 'fence', 'seq', 'attempt', 'w', 'id', 'deadline_at', 'payload',
                         'timeout_ms', 'trace_id', 'session_id', 'metadata', 'max_attempts'}

-- Hand a task to an agent's inbox as a new delivery: `f` is its record's DELIVERY_FIELDS (as
-- HMGET returned them), `h` the HSET arguments of the change so far (deliver adds its own and
-- writes them). The record keeps the entry's id (`entry`), so a cancel can take an unread entry
-- back. Returns the new fence.
local function deliver(c, task_key, f, h, inbox, agent, local_id, now_s, why, extra)
  -- (the fence as text once: every number handed to redis.call or concatenated is a printf)
  local fence = tostring((tonumber(f[2]) or 0) + 1)
  local attempt = f[4] or '0'
  local payload = f[8] or ''
  local entry
  if #payload <= INBOX_PAYLOAD_MAX then
    entry = redis.call('XADD', inbox, '*', 'id', local_id, 'fence', fence, 'p', payload,
      'x', (tonumber(attempt) + 1) .. '|' .. (f[9] or '0') .. '|' .. (f[7] or '0') .. '|' ..
      (f[13] or '1') .. '|' .. (f[10] or '') .. '|' .. (f[11] or '') .. '|' .. (f[12] or ''))
  else
    entry = redis.call('XADD', inbox, '*', 'id', local_id, 'fence', fence)
  end
  local seq, text = new_event(c, f[6], tonumber(f[3]) or 0, attempt, f[5], 'dispatched', agent, now_s,
    '{"fence":' .. fence .. (extra or '') .. '}')
  local e = 'e:' .. seq
  local explain = why and why ~= ''
  if #h == 0 then
    -- The hot path (dispatch, pulls) names its fields in the call: building a table to unpack
    -- cost about 15 % of a dispatched task's time in Redis.
    if explain then
      redis.call('HSET', task_key, 'state', 'dispatched', 'agent_id', agent, 'dispatched_at', now_s,
        'fence', fence, 'entry', entry, 'explain', why, e, text, 'seq', seq)
    else
      redis.call('HSET', task_key, 'state', 'dispatched', 'agent_id', agent, 'dispatched_at', now_s,
        'fence', fence, 'entry', entry, e, text, 'seq', seq)
    end
  else
    local n = #h
    h[n + 1] = 'state'; h[n + 2] = 'dispatched'; h[n + 3] = 'agent_id'; h[n + 4] = agent
    h[n + 5] = 'dispatched_at'; h[n + 6] = now_s; h[n + 7] = 'fence'; h[n + 8] = fence
    h[n + 9] = 'entry'; h[n + 10] = entry; h[n + 11] = e; h[n + 12] = text
    h[n + 13] = 'seq'; h[n + 14] = seq
    if explain then
      h[n + 15] = 'explain'; h[n + 16] = why
    end
    redis.call('HSET', task_key, unpack(h))
  end
  return tonumber(fence)
end

-- Record the start of an attempt (the task loaded with state, fence, agent_id): count it, mark
-- the task running by the process whose token hashes to `token_sha`, tell the listeners. The
-- changes are staged (save writes them). `at`: when it started (server clock, ms).
local function start_attempt(c, t, agent, token_sha, at)
  set(t, 'attempt', (tonumber(t.attempt) or 0) + 1)
  set(t, 'state', 'running')
  set(t, 'started_at', jint(at))
  set(t, 'accepted_by', token_sha)
  event(c, t, 'accepted', agent, at, '{}')
end

-- The agent's token, checked against the hash stored at registration (the token itself is
-- never stored). Returns true when it matches; a refusal is counted (field
-- 'refused:<agent>' of the tokens hash) and, when a feed is given, recorded on it.
local function token_ok(tokens_key, agent, token, c, what)
  local stored = redis.call('HGET', tokens_key, agent)
  if stored and token ~= '' and stored == redis.sha1hex(token) then return true end
  redis.call('HINCRBY', tokens_key, 'refused:' .. agent, 1)
  if c and c.feed_maxlen > 0 then
    redis.call('XADD', c.feed, 'MAXLEN', '~', c.feed_maxlen, '*', 'events',
      '|0|token_refused|' .. jint(now_ms()) .. '|0|' .. agent .. '|{"call":' .. jstr(what) .. '}')
  end
  return false
end
