-- A ready task's score in the queue: when it became ready minus priority x aging_ms (higher
-- priority first, and a waiting task gains a level per aging_ms with no rescoring), plus a
-- fraction that carries its priority and whether it has routing constraints (a session, a
-- region, a version, an agent to avoid), so that ZRANGE WITHSCORES is all a dispatcher reads of
-- a plain task. Its Python twin, with the decoder, is broker/protocol/queue_score.py (a test
-- holds the two to the same numbers). Scores are whole milliseconds, far below 2^52, so the
-- fraction survives in a double. (Returned as text: Lua would print the number with 14
-- significant digits, which loses the fraction.)
local function queue_score(now, priority, aging, has_constraints)
  local frac = (priority + 1) / 16
  if has_constraints then frac = frac + 1 / 32 end
  return string.format('%.5f', now - priority * aging + frac)
end

-- (priority, has constraints) of a queue score, as queue_score encoded them.
local function queue_hint(score)
  local steps = math.floor((tonumber(score) % 1) * 32 + 0.5)
  return math.floor(steps / 2) - 1, steps % 2 == 1
end

-- Whether a task (its session_id, region, routing, last_agent_id fields) has routing constraints.
local function constrained(session, region, routing, last_agent)
  return (session and session ~= '') or (region and region ~= '') or (routing and routing ~= '')
    or (last_agent and last_agent ~= '') or false
end
