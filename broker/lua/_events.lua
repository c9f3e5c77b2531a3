-- A task's events live in its own record: field `seq` counts them and field `e:<n>` holds event
-- n as `type|time ms|attempt|agent id|data JSON` (the task id and trace id are the record's).
-- So an event costs no command of its own: it is two more fields in the HSET that changes the
-- task's state. Waiters register (watch.lua, or submit for its own producer): field `w` = '1'
-- while someone follows the task's events (only then are they published on its channel), 'o'
-- while someone only waits for its outcome (published on the channel as it ends, _finish.lua),
-- field `d` while someone blocks on its done list (only then is the outcome pushed there).
-- Readers parse events in broker/models.py (TaskEvent.from_compact) and feed lines in
-- broker/client/events.py.
-- A task keeps only its latest progress events (progress.lua: fields `pk`, `pn`,
-- `progress_dropped`), so seqs may have gaps: readers take the `e:` fields there are.

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

-- Event seq+1 of a task, for the hot paths (submit, dispatch, complete), which write a task's
-- change with explicit HSET arguments or a plain list instead of a task table: publishes it if
-- someone watches the task (w = '1'), queues its line for the feed, and returns seq+1 and the
-- event as text, for the caller to write as fields `seq` and `e:<seq>`. `now_s`: the time as
-- text; `attempt`: as text.
local function new_event(c, id, seq, attempt, w, etype, agent, now_s, data)
  local seq_s = tostring(seq + 1)  -- (once: every number turned into text is a printf)
  local text = etype .. '|' .. now_s .. '|' .. attempt .. '|' .. (agent or '') .. '|' .. data
  if w == '1' then
    redis.call('PUBLISH', c.chan .. id, seq_s .. '|' .. text)
  end
  if c.feed_maxlen > 0 then
    c.lines[#c.lines + 1] = id .. '|' .. seq_s .. '|' .. text
  end
  return seq_s, text
end

-- new_event, with its field appended to the HSET arguments `h`; returns seq+1.
local function add_event(h, c, id, seq, attempt, w, etype, agent, now_s, data)
  local seq_s, text = new_event(c, id, seq, attempt, w, etype, agent, now_s, data)
  local n = #h
  h[n + 1] = 'e:' .. seq_s
  h[n + 2] = text
  return seq + 1
end

-- Add an event to a loaded task (staged with its other changes).
local function event(c, t, etype, agent, now, data)
  t.seq = add_event(t._set, c, t.id or '', tonumber(t.seq) or 0, jint(t.attempt), t.w, etype, agent,
    jint(now), data or '{}')
  t._seq_dirty = true
end

-- One feed entry per call, holding every event the call made (one `task id|seq|event` line each);
-- and the counts the call made (count in _base.lua), one HINCRBY per counter.
local function flush_feed(c)
  if #c.lines > 0 then
    redis.call('XADD', c.feed, 'MAXLEN', '~', c.feed_maxlen, '*', 'events', table.concat(c.lines, '\n'))
    c.lines = {}
  end
  if c.counts then
    for field, n in pairs(c.counts) do
      if n ~= 0 then redis.call('HINCRBY', c.stats, field, n) end
    end
    c.counts = nil
  end
end

-- The trace id in a record's `trace` field (its traceparent's, characters 4 to 35: see
-- broker/protocol/trace.py), '' when it holds none.
local function trace_id_of(trace)
  if not trace or #trace < 55 then return '' end
  return string.sub(trace, 4, 35)
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
