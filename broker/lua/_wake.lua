-- The wake-ups the dispatchers listen to on the wake channel (ARGV of each script that sends
-- one). Each message is built here only; broker/protocol/wake.py defines and parses them:
--   task <cap>
--   free <cap> <agent> <len> <pending> <failures> <n> <exec ms> <pulled> [<speed ms> <samples>]
--   took <cap> <agent> <len> <pending> <n> <left>
--   agent <agent>
--   policy <cap>

local function wake_task(channel, cap)
  redis.call('PUBLISH', channel, 'task ' .. cap)
end

-- (`speed`: '<ms> <samples>' of the agent's speed after this call, or nil: see _health.lua.)
local function wake_free(channel, cap, agent, len, pending, failures, n, exec_ms, pulled, speed)
  redis.call('PUBLISH', channel, 'free ' .. cap .. ' ' .. agent .. ' ' .. len .. ' ' .. pending ..
    ' ' .. failures .. ' ' .. n .. ' ' .. jint(exec_ms) .. ' ' .. pulled ..
    (speed and (' ' .. speed) or ''))
end

local function wake_took(channel, cap, agent, len, pending, n, left)
  redis.call('PUBLISH', channel, 'took ' .. cap .. ' ' .. agent .. ' ' .. len .. ' ' .. pending ..
    ' ' .. n .. ' ' .. left)
end

local function wake_agent(channel, agent)
  redis.call('PUBLISH', channel, 'agent ' .. agent)
end

-- policy <cap>: a capability's policy changed ('*': the fleet's defaults).
local function wake_policy(channel, cap)
  redis.call('PUBLISH', channel, 'policy ' .. cap)
end
