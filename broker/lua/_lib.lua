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
local function event(c, t, etype, agent, now, data)
  local seq = (tonumber(t.seq) or 0) + 1
  t.seq = seq
  t._seq_dirty = true
  local text = etype .. '|' .. jint(now) .. '|' .. jint(t.attempt) .. '|' .. (agent or '') .. '|' ..
    (data or '{}')
  set(t, 'e:' .. seq, text)
  if t.w == '1' then
    redis.call('PUBLISH', c.chan .. 'ev:' .. (t.id or ''), seq .. '|' .. text)
  end
  if c.feed_maxlen > 0 then
    c.lines[#c.lines + 1] = (t.id or '') .. '|' .. seq .. '|' .. text
  end
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
local function finish(c, t, outcome)
  redis.call('PEXPIRE', t._key, c.ttl)
  if t.d == '1' then
    local done = done_key(t._key)
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
  finish(c, t, ended_outcome('failed', reason, err))
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

-- The fields an inbox entry carries besides the task's id and fence, so that the agent can
-- start the task as soon as it reads the entry (payloads over this size are left out: the
-- agent then reads the task record when it accepts the task).
local INBOX_PAYLOAD_MAX = 16384
local DELIVERY_FIELDS = {'payload', 'timeout_ms', 'deadline_at', 'trace_id', 'session_id',
                         'metadata', 'max_attempts'}

-- Hand a task (loaded with DELIVERY_FIELDS, state, fence) to an agent's inbox as a new delivery.
-- The record keeps the entry's id (`entry`), so a cancel can take an unread entry back.
local function deliver(c, t, inbox, agent, local_id, now, why, extra)
  local fence = (tonumber(t.fence) or 0) + 1
  local payload = t.payload or ''
  local entry
  if #payload <= INBOX_PAYLOAD_MAX then
    entry = redis.call('XADD', inbox, '*', 'id', local_id, 'fence', fence, 'p', payload,
      'a', (tonumber(t.attempt) or 0) + 1, 't', t.timeout_ms or '0', 'd', t.deadline_at or '0',
      'tr', t.trace_id or '', 's', t.session_id or '', 'm', t.metadata or '',
      'ma', t.max_attempts or '1')
  else
    entry = redis.call('XADD', inbox, '*', 'id', local_id, 'fence', fence)
  end
  set(t, 'state', 'dispatched')
  set(t, 'agent_id', agent)
  set(t, 'dispatched_at', jint(now))
  set(t, 'fence', fence)
  set(t, 'entry', entry)
  if why and why ~= '' then set(t, 'explain', why) end
  event(c, t, 'dispatched', agent, now, '{"fence":' .. fence .. (extra or '') .. '}')
  save(t)
  return fence
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
