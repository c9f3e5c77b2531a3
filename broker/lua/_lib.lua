-- Shared helpers, prepended to every script of this folder when it is loaded (broker/scripts.py).
-- Each script still declares every key it touches in KEYS; these helpers only take key names
-- from their callers. Times come from the Redis server clock (TIME), never from a client.

if redis.replicate_commands then pcall(redis.replicate_commands) end

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

-- The context every state change needs: where events go and how long records live.
-- c = {feed=key, feed_maxlen=n, chan=channel prefix, ttl=result ttl ms}
local function emit(c, task_key, events_key, etype, agent, now, data)
  local f = redis.call('HMGET', task_key, 'id', 'attempt', 'trace_id')
  local seq = redis.call('HINCRBY', task_key, 'seq', 1)
  local ev = '{"seq":' .. seq .. ',"type":"' .. etype .. '","task_id":' .. jstr(f[1]) ..
    ',"attempt":' .. jint(f[2]) .. ',"agent_id":' .. jstr(agent) .. ',"trace_id":' .. jstr(f[3]) ..
    ',"time":' .. jint(now) .. ',"data":' .. (data or '{}') .. '}'
  redis.call('RPUSH', events_key, ev)
  if c.feed_maxlen > 0 then
    redis.call('XADD', c.feed, 'MAXLEN', '~', c.feed_maxlen, '*', 'event', ev)
  end
  redis.call('PUBLISH', c.chan .. 'ev:' .. (f[1] or ''), ev)
  return ev
end

-- A task reached a terminal state: push the state to its `done` list (waiters block on it with
-- BLMOVE done done, which wakes every waiter and leaves the list as it was) and keep the record,
-- events and done list for the result TTL, then let Redis drop them.
local function finish(c, task_key, events_key, done_key, state)
  redis.call('DEL', done_key)
  redis.call('RPUSH', done_key, state)
  redis.call('PEXPIRE', task_key, c.ttl)
  redis.call('PEXPIRE', events_key, c.ttl)
  redis.call('PEXPIRE', done_key, c.ttl)
end

-- Move a task to its terminal `failed` state and park it in the dead-letter stream with its
-- whole record and history, so it can be inspected and replayed even after the record expires.
local function fail_task(c, task_key, events_key, done_key, dlq_key, reason, err, agent, now)
  redis.call('HSET', task_key, 'state', 'failed', 'reason', reason, 'error', err or '',
    'finished_at', jint(now))
  local data = '{"reason":' .. jstr(reason) .. ',"error":' .. jstr(err) .. '}'
  if reason == 'expired' then emit(c, task_key, events_key, 'expired', agent, now, data) end
  emit(c, task_key, events_key, 'failed', agent, now, data)
  emit(c, task_key, events_key, 'dead_lettered', agent, now, data)
  local flat = redis.call('HGETALL', task_key)
  local record = {}
  for i = 1, #flat, 2 do record[flat[i]] = flat[i + 1] end
  local history = redis.call('LRANGE', events_key, 0, -1)
  redis.call('XADD', dlq_key, '*',
    'task_id', record['id'] or '', 'reason', reason, 'error', err or '',
    'attempts', record['attempt'] or '0', 'last_agent_id', agent or record['agent_id'] or '',
    'dead_at', jint(now), 'record', cjson.encode(record),
    'history', '[' .. table.concat(history, ',') .. ']')
  finish(c, task_key, events_key, done_key, 'failed')
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

-- The agent's token, checked against the hash stored at registration (the token itself is
-- never stored). Returns true when it matches; a refusal is counted (field
-- 'refused:<agent>' of the tokens hash) and, when a feed is given, recorded on it.
local function token_ok(tokens_key, agent, token, c, what)
  local stored = redis.call('HGET', tokens_key, agent)
  if stored and token ~= '' and stored == redis.sha1hex(token) then return true end
  redis.call('HINCRBY', tokens_key, 'refused:' .. agent, 1)
  if c and c.feed_maxlen > 0 then
    redis.call('XADD', c.feed, 'MAXLEN', '~', c.feed_maxlen, '*', 'event',
      '{"type":"token_refused","agent_id":' .. jstr(agent) .. ',"data":{"call":' .. jstr(what) .. '}}')
  end
  return false
end
