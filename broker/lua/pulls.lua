-- pulls: replace the capability's standing pulls, the agents whose completions may take the
-- next ready tasks themselves while the queue is deep (see complete.lua), with a dispatcher's.
-- KEYS[1] pulls hash
-- ARGV[1] how long the pulls stand unless refreshed (ms)   then ARGV[2..] agent id, pull pairs:
-- `most unread entries|round|score|low` (`low` '1': a cold agent, low-priority tasks only)
-- Returns the number of pulls standing.
redis.call('DEL', KEYS[1])
if #ARGV < 3 then return 0 end
call_in_chunks('HSET', KEYS[1], ARGV, 2)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return (#ARGV - 1) / 2
