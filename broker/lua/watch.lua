-- watch: read what a waiting producer needs of a task and, if it has not ended, register the
-- wait, so that from now on the task's events are published on its channel (flag `w` = '1'),
-- or only its outcome is (`w` = 'o', an 'outcome' wait), or its outcome is pushed to its done
-- list (flag `d`). Registering and reading in one step leaves no gap in which the end could be
-- missed. An events wait turns an outcome-only `w` into '1', never the other way.
-- KEYS[1] task hash
-- ARGV[1] 'outcome' (result waiters) or 'events' (event followers)   ARGV[2] the flag to set,
-- 'd' or 'w'   ARGV[3] for 'events': return the events after this seq
-- Returns {false} when the task does not exist, else for 'outcome' {state, result, reason,
-- error} (result only once succeeded) and for 'events' {state, trace context (the record's
-- `trace`), seq, task id, then the events after ARGV[3] as seq, text pairs (compact, see
-- _events.lua), at most 1000; seqs may have gaps where progress events were dropped}.
local key, flag = KEYS[1], ARGV[2]
local f = redis.call('HMGET', key, 'state', flag, 'trace', 'seq', 'id', 'progress_dropped')
local state = f[1]
if not state then return {false} end
local value = (flag == 'w' and ARGV[1] == 'outcome') and 'o' or '1'
if (not f[2] or (value == '1' and f[2] ~= '1'))
    and state ~= 'succeeded' and state ~= 'failed' and state ~= 'canceled' then
  redis.call('HSET', key, flag, value)
end
if ARGV[1] == 'outcome' then
  local o = redis.call('HMGET', key, 'reason', 'error')
  local result = false
  if state == 'succeeded' then result = redis.call('HGET', key, 'result') end
  return {state, result, o[1], o[2]}
end
local after, seq = tonumber(ARGV[3]) or 0, tonumber(f[4]) or 0
local out = {state, f[3] or '', seq, f[5] or ''}
local names, seqs = {}, {}
if f[6] then
  -- Progress events were dropped (progress.lua keeps the latest few): the seqs have gaps, maybe
  -- long ones, so take the events the record holds (it is bounded) rather than every seq.
  for _, name in ipairs(redis.call('HKEYS', key)) do
    local s = string.sub(name, 1, 2) == 'e:' and tonumber(string.sub(name, 3))
    if s and s > after then seqs[#seqs + 1] = s end
  end
  table.sort(seqs)
  for i = 1001, #seqs do seqs[i] = nil end
else
  for s = after + 1, math.min(seq, after + 1000) do seqs[#seqs + 1] = s end
end
for i, s in ipairs(seqs) do names[i] = 'e:' .. s end
if #names > 0 then
  local texts = redis.call('HMGET', key, unpack(names))
  for i, text in ipairs(texts) do
    if text then
      out[#out + 1] = seqs[i]
      out[#out + 1] = text
    end
  end
end
return out
