-- dlq_stats: count one page of a dead-letter stream by reason and by error message, on the
-- server, so statistics over a large stream move only counters to the client. Read-only.
-- KEYS[1] dead-letter stream
-- ARGV[1] where to start, oldest first ('-', or '(' .. id to continue after an id)
-- ARGV[2] most entries to examine in this call   ARGV[3] length error messages are cut to
-- Returns {cursor, examined, oldest dead_at, newest dead_at, {reason, count, ...},
-- {error, count, ...}}; cursor is '' once the stream is exhausted, else the last id examined.
local budget, cut = tonumber(ARGV[2]), tonumber(ARGV[3])
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', budget)
local reasons, errors = {}, {}
local oldest, newest = 0, 0
for _, entry in ipairs(entries) do
  local flat = entry[2]
  local reason, err, dead = '', '', 0
  for i = 1, #flat, 2 do
    local name = flat[i]
    if name == 'reason' then reason = flat[i + 1]
    elseif name == 'error' then err = flat[i + 1]
    elseif name == 'dead_at' then dead = tonumber(flat[i + 1]) or 0 end
  end
  reasons[reason] = (reasons[reason] or 0) + 1
  err = string.sub(err, 1, cut)
  errors[err] = (errors[err] or 0) + 1
  if dead > 0 and (oldest == 0 or dead < oldest) then oldest = dead end
  if dead > newest then newest = dead end
end
local function flatten(t)
  local out = {}
  for k, v in pairs(t) do
    out[#out + 1] = k
    out[#out + 1] = v
  end
  return out
end
local cursor = ''
if #entries == budget then cursor = entries[#entries][1] end
return {cursor, #entries, string.format('%d', oldest), string.format('%d', newest),
  flatten(reasons), flatten(errors)}
