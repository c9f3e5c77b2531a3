-- dlq_replay: put dead-lettered tasks back on their capability's ready queue and take their
-- entries off the dead-letter stream in the same step, so that a crash between two entries can
-- neither lose one nor queue one twice. The task keeps its id, history and fencing token; it gets
-- a fresh attempt count (unless asked to keep it), a `replayed` event and a `queued` event.
-- KEYS[1] dead-letter stream   KEYS[2] queue zset   KEYS[3] capability event feed
-- KEYS[4] deadlines zset (when expire.lua looks at a task)   KEYS[5] policy hash (aging, the
-- queue's depth limit)   KEYS[6] the task index (a replayed task goes to its top)
-- then KEYS[7+i] the task hash of entry i (0-based)
-- ARGV[1] policy defaults   ARGV[2] feed maxlen   ARGV[3] task channel prefix   ARGV[4] capability
-- ARGV[5] (unused)   ARGV[6] priority 0-9 ('' keeps each task's own)
-- ARGV[7] '1' resets the attempt count, '0' keeps it   ARGV[8] wake channel
-- then for entry i, 4 values from ARGV[9+4i]: dead-letter entry id, task id, local id, the
--   entry's history as event JSON texts joined by newlines (used only to rebuild the task's
--   events when its record has expired; the entry's own `record` field rebuilds the record)
-- A task whose record exists and is not `failed` (it was replayed or resubmitted meanwhile) is
-- left alone and so is its entry; so is everything once the queue is full. A task with a
-- deadline gets the same budget again, counted from the replay, and is indexed for expire.lua
-- at that deadline; any other index entry is dropped (the no-agent timeout, which counts from
-- creation, would fail a replayed task at once).
-- Returns for each entry {status, detail}: 'replayed' (detail: priority), 'gone' (the entry is no
-- longer in the stream), 'malformed' (a raw entry, no task to replay), 'mismatch' (the entry
-- holds another task), 'active' (detail: the task's state), 'full' (detail: queue depth),
-- 'corrupt' (the record is gone and the entry's copy of it is unusable).
local c = context(KEYS[3], ARGV[2], ARGV[3], 0)
local dlq, queue = KEYS[1], KEYS[2]
local p = load_policy(KEYS[5], ARGV[1])
local aging, max_depth = tonumber(p.aging), tonumber(p.max_depth)
local reset = ARGV[7] == '1'
local n = #KEYS - 6
local now = now_ms()
local depth = redis.call('ZCARD', queue)
local out = {}
local replayed = 0

-- The entry's record as a flat field list, or nil unless it is a JSON object of scalars that
-- names this task.
local function record_fields(record_json, task_id)
  local ok, record = pcall(cjson.decode, record_json)
  if not ok or type(record) ~= 'table' or record['id'] ~= task_id then return nil end
  local flat = {}
  for k, v in pairs(record) do
    if type(k) ~= 'string' or (type(v) ~= 'string' and type(v) ~= 'number') then return nil end
    flat[#flat + 1] = k
    flat[#flat + 1] = tostring(v)
  end
  return flat
end

-- Write the record back from the entry's copy, and its events (compact, see _events.lua) from the
-- entry's history.
local function rebuild(task_key, flat, history)
  if #flat > 0 then redis.call('HSET', task_key, unpack(flat)) end
  local batch, seq = {}, 0
  for text in string.gmatch(history, '[^\n]+') do
    local ok, ev = pcall(cjson.decode, text)
    if ok and type(ev) == 'table' then
      seq = tonumber(ev['seq']) or (seq + 1)
      local agent = ev['agent_id']
      if type(agent) ~= 'string' then agent = '' end
      local data = ev['data']
      if type(data) == 'table' and next(data) ~= nil then data = cjson.encode(data) else data = '{}' end
      batch[#batch + 1] = 'e:' .. jint(seq)
      batch[#batch + 1] = tostring(ev['type']) .. '|' .. jint(ev['time']) .. '|' .. jint(ev['attempt']) ..
        '|' .. agent .. '|' .. data
      if #batch == 1000 then
        redis.call('HSET', task_key, unpack(batch))
        batch = {}
      end
    end
  end
  if #batch > 0 then redis.call('HSET', task_key, unpack(batch)) end
  redis.call('HSET', task_key, 'seq', jint(seq))
end

for i = 0, n - 1 do
  local task_key = KEYS[7 + i]
  local a = 9 + 4 * i
  local entry_id, task_id, local_id, history = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local found = redis.call('XRANGE', dlq, entry_id, entry_id)
  local status, detail = nil, ''
  local e = {}
  if #found == 0 then
    status = 'gone'
  else
    local flat = found[1][2]
    for j = 1, #flat, 2 do e[flat[j]] = flat[j + 1] end
    local state = redis.call('HGET', task_key, 'state')
    if (e['task_id'] or '') == '' then
      status = 'malformed'
    elseif e['task_id'] ~= task_id then
      status = 'mismatch'
    elseif state and state ~= 'failed' then
      status, detail = 'active', state
    elseif not state and not record_fields(e['record'] or '', task_id) then
      status = 'corrupt'
    elseif depth >= max_depth then
      status, detail = 'full', tostring(depth)
    else
      if not state then
        -- The record expired with the result TTL: rebuild it and its events from the entry.
        redis.call('DEL', task_key)
        rebuild(task_key, record_fields(e['record'], task_id), history)
      end
      redis.call('PERSIST', task_key)
      redis.call('DEL', task_key .. DONE_SUFFIX)
      local t = load_task(task_key, {'priority', 'deadline_at', 'created_at', 'replayed_at',
        'session_id', 'region', 'routing', 'last_agent_id'})
      local priority = tonumber(ARGV[6]) or tonumber(t.priority) or 5
      local deadline_at = tonumber(t.deadline_at) or 0
      if deadline_at > 0 then
        -- (the budget counts from the last replay, if any: from creation it would grow by the
        -- time between creation and that replay at every replay)
        local since = math.max(tonumber(t.created_at) or deadline_at, tonumber(t.replayed_at) or 0)
        local budget = deadline_at - since
        if budget > 0 then deadline_at = now + budget else deadline_at = 0 end
      end
      local replays = redis.call('HINCRBY', task_key, 'replays', 1)
      local previous_attempts = t.attempt
      redis.call('HDEL', task_key, 'agent_id', 'dispatched_at', 'started_at', 'finished_at',
        'accepted_by', 'result', 'exec_ms', 'reason', 'error', 'entry', 'w')
      -- (`d` stays: a producer that submitted the task a moment ago may block on its done list
      -- without asking again, and must be woken by this run's outcome; the old one is gone.)
      t.w = false
      set(t, 'state', 'queued')
      set(t, 'queued_at', jint(now))
      set(t, 'replayed_at', jint(now))
      set(t, 'priority', jint(priority))
      set(t, 'deadline_at', jint(deadline_at))
      if reset then set(t, 'attempt', '0') end
      event(c, t, 'replayed', nil, now,
        '{"dlq_entry":' .. jstr(entry_id) .. ',"replay":' .. jint(replays) ..
        ',"previous_reason":' .. jstr(e['reason']) .. ',"previous_error":' .. jstr(e['error']) ..
        ',"previous_attempts":' .. jint(previous_attempts) .. ',"attempts_reset":' .. tostring(reset) ..
        ',"priority":' .. jint(priority) .. '}')
      event(c, t, 'queued', nil, now, '{"priority":' .. jint(priority) .. '}')
      save(t)
      redis.call('ZADD', queue, queue_score(now, priority, aging,
        constrained(t.session_id, t.region, t.routing, t.last_agent_id)), local_id)
      if deadline_at > 0 then
        redis.call('ZADD', KEYS[4], deadline_at, local_id)
      else
        redis.call('ZREM', KEYS[4], local_id)
      end
      redis.call('ZADD', KEYS[6], now, local_id)
      redis.call('XDEL', dlq, entry_id)
      depth = depth + 1
      replayed = replayed + 1
      status, detail = 'replayed', jint(priority)
    end
  end
  out[#out + 1] = status
  out[#out + 1] = detail
end
flush_feed(c)
if replayed > 0 then wake_task(ARGV[8], ARGV[4]) end
return out
