-- grant: replace the capability's grants, the inbox slots that submit may fill directly while
-- the ready queue is empty (see submit.lua), with the ones a dispatcher's routing round left.
-- KEYS[1] grants list   KEYS[2] granted hash (agent id -> its grant, '#' -> grants written)
-- ARGV[1] how long the grants stand unless refreshed (ms)   ARGV[2] P, then ARGV[3..2+P] the
-- agents whose probe grant the set being replaced may still hold (see below)   then from
-- ARGV[3+P] the grants, in the order they are to be used: `agent|most unread entries|round|score|low`
--
-- The granted hash says which agents the standing set names, and how big it was: an agent's
-- completion that changes nothing a dispatcher acts on gives back the grants its tasks used
-- (credits, see complete.lua) while its grant stands here, and submit tells the dispatchers
-- once fewer than half of '#' are left. Both keys live and die together.
--
-- Probe grants: an agent back from an open circuit (or an ejection) is let one probe task,
-- and while the queue is empty that task comes by grant. The dispatcher counts the probe as
-- out from the moment it grants it and gives the agent nothing more until the probe's
-- outcome or a lease has passed, so a probe grant that a rewrite drops unused would keep the
-- agent out for that long with no probe running. An unused one is therefore carried over:
-- put first in the new set (the new grants, computed while the probe counted as out, do not
-- name the agent). When the new set is empty (the queue has tasks again: grants are taken
-- back) nothing is carried, and the dispatcher takes the probe back instead.
-- Returns {grants standing, then the agents of P whose probe grant was still unused}.
local function agent_of(grant) return string.match(grant, '^([^|]+)|') end

local p = tonumber(ARGV[2])
local unused = {}
if p > 0 then
  local looking = {}
  for i = 3, 2 + p do looking[ARGV[i]] = true end
  for _, grant in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
    local agent = agent_of(grant)
    if agent and looking[agent] then
      looking[agent] = nil
      unused[#unused + 1] = grant
    end
  end
end
redis.call('DEL', KEYS[1], KEYS[2])
local out = {0}
local grants = {}
if #ARGV >= 3 + p then
  for _, grant in ipairs(unused) do grants[#grants + 1] = grant end
  for i = 3 + p, #ARGV do grants[#grants + 1] = ARGV[i] end
end
for _, grant in ipairs(unused) do out[#out + 1] = agent_of(grant) end
if #grants == 0 then return out end
call_in_chunks('RPUSH', KEYS[1], grants, 1)
local by_agent = {'#', tostring(#grants)}
local seen = {}
for _, grant in ipairs(grants) do
  local agent = agent_of(grant)
  if agent and not seen[agent] then
    seen[agent] = true
    by_agent[#by_agent + 1] = agent
    by_agent[#by_agent + 1] = grant
  end
end
call_in_chunks('HSET', KEYS[2], by_agent, 1)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
out[1] = #grants
return out
