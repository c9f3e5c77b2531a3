-- grant: replace the capability's grants, the inbox slots that submit may fill directly while
-- the ready queue is empty (see submit.lua), with the ones a dispatcher's routing round left.
-- KEYS[1] grants list   KEYS[2] granted hash (agent id -> its grant, '#' -> grants written)
-- ARGV[1] how long the grants stand unless refreshed (ms)   then ARGV[2..] the grants, in the
-- order they are to be used: `agent|most unread entries|round|score|low`
--
-- The granted hash says which agents the standing set names, and how big it was: an agent's
-- completion that changes nothing a dispatcher acts on gives back the grants its tasks used
-- (credits, see complete.lua) while its grant stands here, and submit tells the dispatchers
-- once fewer than half of '#' are left. Both keys live and die together.
-- Returns the number of grants standing.
redis.call('DEL', KEYS[1], KEYS[2])
if #ARGV < 2 then return 0 end
call_in_chunks('RPUSH', KEYS[1], ARGV, 2)
local by_agent = {'#', tostring(#ARGV - 1)}
local seen = {}
for i = 2, #ARGV do
  local agent = string.match(ARGV[i], '^([^|]+)|')
  if agent and not seen[agent] then
    seen[agent] = true
    by_agent[#by_agent + 1] = agent
    by_agent[#by_agent + 1] = ARGV[i]
  end
end
call_in_chunks('HSET', KEYS[2], by_agent, 1)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return #ARGV - 1
