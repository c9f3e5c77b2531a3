-- grant: replace the capability's grants, the inbox slots that submit may fill directly while
-- the ready queue is empty (see submit.lua), with the ones a dispatcher's routing round left.
-- KEYS[1] grants list
-- ARGV[1] how long the grants stand unless refreshed (ms)   then ARGV[2..] the grants, in the
-- order they are to be used: `agent|most unread entries|round|score`
-- Returns the number of grants standing.
redis.call('DEL', KEYS[1])
if #ARGV < 2 then return 0 end
call_in_chunks('RPUSH', KEYS[1], ARGV, 2)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return #ARGV - 1
