-- dead_letter_raw: park an entry that is not a valid message (written by someone else, or
-- corrupted) in the capability's dead-letter stream with its raw fields, and take it off its
-- stream, atomically, so it is neither lost nor read again.
-- KEYS[1] the stream that held the entry   KEYS[2] dead-letter stream
-- KEYS[3] capability stats hash (counts it as failed with its reason)
-- ARGV[1] consumer group   ARGV[2] entry id   ARGV[3] reason   ARGV[4] error   ARGV[5] raw fields JSON
-- ARGV[6] capability
-- Returns 1.
local now = now_ms()
redis.call('XADD', KEYS[2], '*', 'task_id', '', 'reason', ARGV[3], 'error', ARGV[4],
  'attempts', '0', 'last_agent_id', '', 'dead_at', string.format('%d', now),
  'record', '{"cap":' .. cjson.encode(ARGV[6]) .. '}', 'history', '[]', 'raw', ARGV[5],
  'source', KEYS[1] .. ' ' .. ARGV[2])
redis.call('HINCRBY', KEYS[3], STAT_FAILED .. ARGV[3], 1)
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
