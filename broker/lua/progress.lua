-- progress: the running attempt of a task reports progress.
-- KEYS[1] task hash   KEYS[2] capability event feed   KEYS[3] agent tokens hash
-- ARGV[1] agent id   ARGV[2] agent token   ARGV[3] fencing token   ARGV[4] progress data (JSON)
-- ARGV[5] feed maxlen   ARGV[6] task channel prefix   ARGV[7] most progress events a task keeps
-- Returns 'ok', or why the report was refused: 'refused' (token), 'gone', 'canceled', 'stale'
-- (a superseded attempt: its reports are dropped).
--
-- A task keeps its latest ARGV[7] progress events: field `pk` lists their seqs (oldest first,
-- comma-separated), `pn` counts them, and `progress_dropped` counts those deleted to make room
-- (so a handler that reports in a loop cannot grow the record without bound). The seqs of the
-- dropped events are gaps that readers skip (see watch.lua).
local c = context(KEYS[2], ARGV[5], ARGV[6], 0)
local now = now_ms()
local token_sha = token_ok(KEYS[3], ARGV[1], ARGV[2], c, 'progress', now)
if not token_sha then return 'refused' end
local t = load_task(KEYS[1], {'state', 'fence', 'agent_id', 'pk', 'pn', 'progress_dropped'})
if not t.state then return 'gone' end
if t.state == 'canceled' then return 'canceled' end
if (t.state ~= 'running' and t.state ~= 'dispatched') or t.fence ~= ARGV[3] or t.agent_id ~= ARGV[1] then
  return 'stale'
end
if t.state == 'dispatched' then
  -- The agent started the task from its inbox entry and the record of the start is on its way
  -- (see accept.lua): record it now, so the start comes before the progress.
  start_attempt(c, t, ARGV[1], token_sha, now)
end
event(c, t, 'progress', ARGV[1], now, ARGV[4])
local kept, n = t.pk or '', (tonumber(t.pn) or 0) + 1
kept = (kept == '') and jint(t.seq) or (kept .. ',' .. jint(t.seq))
local most, dropped = math.max(tonumber(ARGV[7]) or 100, 1), 0
while n > most do
  local comma = string.find(kept, ',', 1, true)
  if not comma then break end
  redis.call('HDEL', KEYS[1], 'e:' .. string.sub(kept, 1, comma - 1))
  kept = string.sub(kept, comma + 1)
  n = n - 1
  dropped = dropped + 1
end
set(t, 'pk', kept)
set(t, 'pn', tostring(n))
if dropped > 0 then set(t, 'progress_dropped', tostring((tonumber(t.progress_dropped) or 0) + dropped)) end
save(t)
flush_feed(c)
return 'ok'
