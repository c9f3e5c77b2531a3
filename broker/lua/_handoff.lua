-- Direct hand-off ("sync match", as Temporal's matching service calls it), used by submit.lua:
-- while nothing waits in the ready queue, a task without routing constraints goes straight to
-- an agent's inbox, taking the next grant a dispatcher left in the grants list. A grant is
-- `agent|most unread entries|round|score|low[|most in flight]` (broker/protocol/grants.py): the dispatcher orders
-- grants by weighted random choice over the agents' scores and gives an agent no more than its
-- room, so this is the dispatcher's own decision, taken ahead of time. `low` is '1' for a grant
-- of a cold agent (recovered lately), which only a low-priority task may take; a task of higher
-- priority puts it back at the end. The grant is checked here (token, not draining, inbox below
-- its limit; and its length, the entries read and unread, below `most in flight`: a grant written
-- while the agent had a free slot is no use once its slots filled another way, e.g. a set written
-- from loads read just before submits used the set before, which its credits would carry on) and
-- skipped when stale; the list expires unless a dispatcher keeps refreshing it.

-- The agent of the next grant a task of `priority` may use, from the grants list `g` (a table:
-- grants, granted, tokens keys; inbox_prefix; low_max): {agent, inbox, round, score, inbox
-- length, inbox pending (-1: not looked at)} or nil.
local function next_grant(g, priority)
  for _ = 1, 4 do
    local grant = redis.call('LPOP', g.grants)
    if not grant then return nil end
    local agent, most, round, score, low, inflight =
      string.match(grant, '^([^|]+)|(%d+)|([^|]*)|([^|]*)|([^|]*)|?(%d*)$')
    if agent and low == '1' and priority > g.low_max then
      -- For a low-priority task that comes later. (A list the LPOP emptied is gone, and its
      -- expiry with it: the grant stands only as long as its set.)
      if redis.call('RPUSH', g.grants, grant) == 1 then
        local ttl = redis.call('PTTL', g.granted)
        if ttl > 0 then redis.call('PEXPIRE', g.grants, ttl) else redis.call('DEL', g.grants) end
      end
    elseif agent and takes_work(g.tokens, agent) then
      -- (An agent with a token has its inbox and group, see dispatch.lua; how many entries
      -- it has read matters only near the limit.)
      local inbox = g.inbox_prefix .. agent
      local len, pending = redis.call('XLEN', inbox), -1
      local bound = tonumber(inflight) or 0
      if bound <= 0 or len < bound then
        if len + 1 > tonumber(most) then len, pending = inbox_load(inbox) end
        if pending < 0 or len - pending < tonumber(most) then
          return {agent, inbox, round, score, len, pending}
        end
      end
    end
  end
  return nil
end

-- The dispatchers hear of the hand-offs (`took`, with the agents' inbox loads and the grants
-- left) only when the grants left fall to a power of two below half of those written ('#' of
-- the granted hash), or to none: a dispatcher acts once fewer than half of the grants it wrote
-- are left (it writes new ones, reading the granted agents' loads first), and a message per
-- hand-off woke every dispatcher for nothing. Above half, no dispatcher acts: the message is
-- not sent (completions give grants back as credits, see _credits.lua, so the grants left
-- hover near the top). `before`: the grants standing before this call; `loads`: agent ->
-- {inbox length, pending, tasks handed} of this call.
local function tell_took(g, wake, cap, before, loads)
  local left = redis.call('LLEN', g.grants)
  local p = 1
  while p * 2 < before do p = p * 2 end  -- the largest power of two below the grants before
  local tell = left == 0
  if not tell and p >= left then
    local written = tonumber(redis.call('HGET', g.granted, '#'))
    tell = not written or left * 2 < written
  end
  if tell then
    for agent, load in pairs(loads) do
      wake_took(wake, cap, agent, load[1], load[2], load[3], left)
    end
  end
end
