-- schedule_fired: record that a schedule's task for a due time was submitted, unless a later
-- due time was recorded already (several dispatchers fire the same schedules).
-- KEYS[1] the schedules' last fire times (hash name -> ms)
-- ARGV[1] schedule name   ARGV[2] due time ms
-- Returns 1 when recorded, 0 when a later one stands.
local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1])) or 0
if tonumber(ARGV[2]) <= last then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
