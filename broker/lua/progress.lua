-- progress: the running attempt of a task reports progress.
-- KEYS[1] task hash   KEYS[2] capability event feed   KEYS[3] agent tokens hash
-- ARGV[1] agent id   ARGV[2] agent token   ARGV[3] fencing token   ARGV[4] progress data (JSON)
-- ARGV[5] feed maxlen   ARGV[6] task channel prefix
-- Returns 'ok', or why the report was refused: 'refused' (token), 'gone', 'canceled', 'stale'
-- (a superseded attempt: its reports are dropped).
local c = context(KEYS[2], ARGV[5], ARGV[6], 0)
if not token_ok(KEYS[3], ARGV[1], ARGV[2], c, 'progress') then return 'refused' end
local t = load_task(KEYS[1], {'state', 'fence', 'agent_id'})
if not t.state then return 'gone' end
if t.state == 'canceled' then return 'canceled' end
if (t.state ~= 'running' and t.state ~= 'dispatched') or t.fence ~= ARGV[3] or t.agent_id ~= ARGV[1] then
  return 'stale'
end
local now = now_ms()
if t.state == 'dispatched' then
  -- The agent started the task from its inbox entry and the record of the start is on its way
  -- (see accept.lua): record it now, so the start comes before the progress.
  start_attempt(c, t, ARGV[1], redis.sha1hex(ARGV[2]), now)
end
event(c, t, 'progress', ARGV[1], now, ARGV[4])
save(t)
flush_feed(c)
return 'ok'
