-- Handing a task to an agent's inbox, and the checks on an agent's reports.

-- Unread entries of an agent's inbox: everything in it minus what the agent already holds.
-- (Finished entries are deleted, so XLEN counts dispatched-and-not-finished exactly.)
local function inbox_load(inbox)
  local len = redis.call('XLEN', inbox)
  local pending = 0
  if len > 0 then
    local ok, summary = pcall(redis.call, 'XPENDING', inbox, AGENT_GROUP)
    if ok and summary then pending = tonumber(summary[1]) or 0 end
  end
  return len, pending
end

-- What an inbox entry carries besides the task's local id (`id`) and fence (`fence`), so that
-- the agent can start the task as soon as it reads it: `p` the payload and `x` the rest, packed
-- as `attempt|timeout ms|deadline at|max attempts|trace|session id|metadata` (metadata last:
-- it may hold '|'). Parsed by broker/protocol/delivery.py (parse_entry). A payload over
-- INBOX_PAYLOAD_MAX is left out: the agent then accepts the task first, which reads the record.
local INBOX_PAYLOAD_MAX = 16384
-- The record fields deliver() needs, in the order it reads them (f[1] state ... f[13]).
local DELIVERY_FIELDS = {'state', 'fence', 'seq', 'attempt', 'w', 'id', 'deadline_at', 'payload',
                         'timeout_ms', 'trace', 'session_id', 'metadata', 'max_attempts'}

-- A task's own setting (a record field the producer gave), else the policy's (both as text).
local function own_or(value, policy_value)
  if value and value ~= '' and value ~= '0' then return value end
  return policy_value
end

-- Hand a task to an agent's inbox as a new delivery: `f` is its record's DELIVERY_FIELDS (as
-- HMGET returned them), `h` the HSET arguments of the change so far (deliver adds its own and
-- writes them), `p` the capability's policy (an attempt's timeout and the attempts allowed,
-- unless the task names its own). The record keeps the entry's id (`entry`), so a cancel can
-- take an unread entry back. Returns the new fence.
local function deliver(c, p, task_key, f, h, inbox, agent, local_id, now_s, why, extra)
  -- (the fence as text once: every number handed to redis.call or concatenated is a printf)
  local fence = tostring((tonumber(f[2]) or 0) + 1)
  local attempt = f[4] or '0'
  local payload = f[8] or ''
  local entry
  if #payload <= INBOX_PAYLOAD_MAX then
    entry = redis.call('XADD', inbox, '*', 'id', local_id, 'fence', fence, 'p', payload,
      'x', (tonumber(attempt) + 1) .. '|' .. own_or(f[9], p.timeout_ms) .. '|' .. (f[7] or '0') ..
      '|' .. own_or(f[13], p.max_attempts) .. '|' .. (f[10] or '') .. '|' .. (f[11] or '') .. '|' ..
      (f[12] or ''))
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
-- never stored) and its expiry (field TOKEN_EXP .. agent, ms; none: it never expires) at `now`.
-- Returns the token's hash when it matches and stands (the caller's scripts record it), else
-- false; a refusal is counted (field 'refused:<agent>' of the tokens hash) and, when a feed is
-- given, recorded on it.
local function token_ok(tokens_key, agent, token, c, what, now)
  local stored = redis.call('HMGET', tokens_key, agent, TOKEN_EXP .. agent)
  local sha = token ~= '' and redis.sha1hex(token)
  if stored[1] and sha and stored[1] == sha then
    if not stored[2] or tonumber(stored[2]) > now then return sha end
    what = what .. ' (expired)'
  end
  redis.call('HINCRBY', tokens_key, 'refused:' .. agent, 1)
  if c and c.feed_maxlen > 0 then
    redis.call('XADD', c.feed, 'MAXLEN', '~', c.feed_maxlen, '*', 'events',
      '|0|token_refused|' .. jint(now) .. '|0|' .. agent .. '|{"call":' .. jstr(what) .. '}')
  end
  return false
end

-- Whether the tokens hash knows the agent (its token stands) and says it is not draining.
local function takes_work(tokens_key, agent)
  local tk = redis.call('HMGET', tokens_key, agent, DRAINING .. agent)
  return tk[1] and not tk[2]
end
