-- Quiet completion, and credits (complete.lua): while the ready queue is empty, a call whose
-- every report is a success within the latency ceiling, from an agent without failures before
-- it and whose grant stands (the granted hash names it: the dispatchers read its load before
-- their next round, see dispatcher/observations.py), changed nothing a dispatcher acts on but
-- the agent's load. It publishes nothing (a wake-up per task was most of a dispatcher's work at
-- low load), and it gives back one grant (its agent's standing one) for each of its tasks that
-- came by grant: the slot that grant promised is free again. So a steady trickle of tasks goes
-- producer -> agent -> producer with no dispatcher round at all. Only a task that came by grant
-- returns one, so an agent holds no more grants than the room it was granted (a task granted
-- under the set before returns its grant to the set now, which was sized while that task still
-- took its room), and the returned grants die with the set. (A set written from loads read just
-- before submits took grants of the set before is off by those tasks, and its credits keep it
-- so, until the next rewrite, a third of the grants' TTL at most; submit's check of the inbox
-- limit holds either way.)

-- Whether the call is quiet (`q` = {grants, granted, tokens keys}); if so, credit `by_grant`
-- grants back to the agent.
local function quiet_credits(q, agent, by_grant)
  local standing = redis.call('HGET', q.granted, agent)
  if not standing or redis.call('HEXISTS', q.tokens, DRAINING .. agent) == 1 then return false end
  if by_grant > 0 then
    local credits = {}
    for i = 1, by_grant do credits[i] = standing end
    redis.call('RPUSH', q.grants, unpack(credits))
    -- (a list that submits emptied is gone, and its expiry with it: it dies with the set)
    if redis.call('PTTL', q.grants) < 0 then
      redis.call('PEXPIRE', q.grants, math.max(1, redis.call('PTTL', q.granted)))
    end
  end
  return true
end
