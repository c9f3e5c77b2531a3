-- progress: the running attempt of a task reports progress.
-- KEYS[1] task hash   KEYS[2] task events   KEYS[3] capability event feed   KEYS[4] agent tokens hash
-- ARGV[1] agent id   ARGV[2] agent token   ARGV[3] fencing token   ARGV[4] progress data (JSON)
-- ARGV[5] feed maxlen   ARGV[6] channel prefix
-- Returns 'ok', or why the report was refused: 'refused' (token), 'gone', 'canceled', 'stale'
-- (a superseded attempt: its reports are dropped).
local c = {feed = KEYS[3], feed_maxlen = tonumber(ARGV[5]), chan = ARGV[6], ttl = 0}
if not token_ok(KEYS[4], ARGV[1], ARGV[2], c, 'progress') then return 'refused' end
local f = redis.call('HMGET', KEYS[1], 'state', 'fence', 'agent_id')
if not f[1] then return 'gone' end
if f[1] == 'canceled' then return 'canceled' end
if f[1] ~= 'running' or f[2] ~= ARGV[3] or f[3] ~= ARGV[1] then return 'stale' end
emit(c, KEYS[1], KEYS[2], 'progress', ARGV[1], now_ms(), ARGV[4])
return 'ok'
