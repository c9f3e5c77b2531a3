-- Shared helpers, prepended to every script of this folder when it is loaded (those it uses:
-- broker/script_source.py, which also writes in the value of each constant of broker/keys.py
-- the scripts name: AGENT_GROUP, DONE_SUFFIX, STAT_SUBMITTED, ...). Scripts take every key and channel from KEYS and ARGV; where a key
-- depends on data (the agent a grant names, a task pulled from the queue) they get its prefix
-- from broker/keys.py in ARGV. Times come from the Redis server clock (TIME), never a client.

if redis.replicate_commands then pcall(redis.replicate_commands) end

local DONE_TTL_MS = 60000     -- a done list only wakes waiters that registered before the end
local DONE_RESULT_MAX = 8192  -- results up to this size ride in the done list itself

-- Run `cmd key args[first..]` in chunks of 1000 arguments (Lua's unpack has a stack limit);
-- an even chunk size keeps field/value pairs together.
local function call_in_chunks(cmd, key, args, first)
  for i = first, #args, 1000 do
    redis.call(cmd, key, unpack(args, i, math.min(i + 999, #args)))
  end
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A JSON string, or null for nil/false/''.
local function jstr(s)
  if s == nil or s == false or s == '' then return 'null' end
  return cjson.encode(s)
end

-- An integer as JSON text (Lua 5.1 numbers are doubles; %d keeps big ms values exact).
local function jint(n)
  return string.format('%d', tonumber(n) or 0)
end

-- What every state change of a script shares: where events go (the capability's feed, and the
-- prefix of the task channels: a task's channel is that plus its id), how long records live,
-- and the capability's stats hash (its counters: broker/keys.py note (8)), where the counts the
-- call made go at its end (see count).
local function context(feed, feed_maxlen, task_channels, ttl, stats)
  return {feed = feed, feed_maxlen = tonumber(feed_maxlen) or 0, chan = task_channels,
          ttl = tonumber(ttl) or 0, lines = {}, stats = stats}
end

-- Add n to the stats counter `field`: kept in the context and written once per field when the
-- call ends (flush_feed), so that a call counting many tasks pays one HINCRBY per counter.
local function count(c, field, n)
  local counts = c.counts
  if not counts then
    counts = {}
    c.counts = counts
  end
  counts[field] = (counts[field] or 0) + n
end
