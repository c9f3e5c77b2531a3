-- dlq_scan: read one page of a dead-letter stream, filtered on the server, so that listing,
-- finding, exporting and purging never carry the whole stream to the client. Read-only.
-- KEYS[1] dead-letter stream
-- ARGV[1] direction: 'rev' (newest first, XREVRANGE) or 'fwd' (oldest first, XRANGE)
-- ARGV[2] the near end of the range (an id, '(' .. id to exclude it, or '+' / '-')
-- ARGV[3] the far end of the range (likewise)
-- ARGV[4] most entries to examine in this call   ARGV[5] most matches to return
-- ARGV[6] reason ('' any)   ARGV[7] last agent id ('' any)   ARGV[8] task id ('' any)
-- ARGV[9] smallest dead_at ms (0: no bound)   ARGV[10] dead_at ms upper bound, exclusive (0: none)
-- ARGV[11] what each match carries: 'ids' (task_id, reason, dead_at, source), 'summary' (every
--   field but record, history and raw), 'full' (every field)
-- Returns {cursor, examined, match...}: cursor is the last id examined, to continue after
-- ('' once the range is exhausted); each match is {entry id, {field, value, ...}}.
local stream, dir = KEYS[1], ARGV[1]
local budget, want = tonumber(ARGV[4]), tonumber(ARGV[5])
local reason, agent, task_id = ARGV[6], ARGV[7], ARGV[8]
local min_dead, max_dead = tonumber(ARGV[9]), tonumber(ARGV[10])
local mode = ARGV[11]

local entries
if dir == 'rev' then
  entries = redis.call('XREVRANGE', stream, ARGV[2], ARGV[3], 'COUNT', budget)
else
  entries = redis.call('XRANGE', stream, ARGV[2], ARGV[3], 'COUNT', budget)
end

-- The fields a match returns, by mode ('full': all of them).
local function project(flat)
  if mode == 'full' then return flat end
  local out = {}
  for i = 1, #flat, 2 do
    local name = flat[i]
    if mode == 'ids' then
      if name == 'task_id' or name == 'reason' or name == 'dead_at' or name == 'source' then
        out[#out + 1] = name
        out[#out + 1] = flat[i + 1]
      end
    elseif name ~= 'record' and name ~= 'history' and name ~= 'raw' then
      out[#out + 1] = name
      out[#out + 1] = flat[i + 1]
    end
  end
  return out
end

-- Whether an entry passes the filters (one pass over its fields, no table built).
local function matches(flat)
  local r, a, t, dead = '', '', '', 0
  for i = 1, #flat, 2 do
    local name = flat[i]
    if name == 'reason' then r = flat[i + 1]
    elseif name == 'last_agent_id' then a = flat[i + 1]
    elseif name == 'task_id' then t = flat[i + 1]
    elseif name == 'dead_at' then dead = tonumber(flat[i + 1]) or 0 end
  end
  return (reason == '' or r == reason) and (agent == '' or a == agent)
    and (task_id == '' or t == task_id) and (min_dead == 0 or dead >= min_dead)
    and (max_dead == 0 or dead < max_dead)
end

local out = {'', 0}
local examined, matched = 0, 0
for _, entry in ipairs(entries) do
  examined = examined + 1
  if matches(entry[2]) then
    out[#out + 1] = {entry[1], project(entry[2])}
    matched = matched + 1
  end
  out[1] = entry[1]
  if matched >= want then break end
end
out[2] = examined
if examined == #entries and #entries < budget then out[1] = '' end
return out
