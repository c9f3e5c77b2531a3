-- task_rows: read task records for a search (broker/ops/search.py), filtered on the server, so
-- that a page that looks at thousands of tasks carries only its matches back. Read-only.
-- KEYS[i] a task hash (all of one capability: one slot)
-- ARGV[1] state ('' any)   ARGV[2] agent id ('' any)   ARGV[3] trace id (32 hex, '' any)
-- ARGV[4] most matches to return   then ARGV[5..] the fields a match carries
-- Returns {examined, i, {values}, i, {values}, ...}: i is the position in KEYS (from 1) of a
-- match, values its fields in ARGV order (false for a missing one). A record that expired
-- matches nothing. It stops at the ARGV[4]th match: `examined` says how many keys it read.
local state, agent, trace, want = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local fields = {}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
local out = {0}
local matched = 0
for i, key in ipairs(KEYS) do
  out[1] = i
  local f = redis.call('HMGET', key, 'state', 'agent_id', 'trace')
  if f[1] and (state == '' or f[1] == state) and (agent == '' or f[2] == agent)
      and (trace == '' or trace_id_of(f[3]) == trace) then
    out[#out + 1] = i
    out[#out + 1] = redis.call('HMGET', key, unpack(fields))
    matched = matched + 1
    if matched >= want then break end
  end
end
return out
