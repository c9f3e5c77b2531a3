-- Pull (BullMQ's worker fetches its next job as it reports the last one), used by complete.lua:
-- while tasks wait in the ready queue, an agent holding a standing pull (the pulls hash, field
-- agent id: `most unread|round|score|low`, see broker/protocol/grants.py, written by the
-- dispatchers for the healthy agents whose circuit is closed) takes the next ones from the
-- queue's front into its inbox, one per slot its report freed, never past its inbox limit: the
-- level of work the dispatcher gave it is kept, without a dispatcher round per completion. It
-- stops at the first task with routing constraints (those the dispatcher places) and, for a
-- cold agent (`low` = '1'), at the first task above the cold start priority. A pulled task's
-- record names the pull (`explain`: `round|pull|score|`).

-- The most unread entries a pull lets the agent's inbox hold (0 for a pull that does not parse).
local function pull_limit(pull)
  return tonumber(string.match(pull, '^(%d+)|')) or 0
end

-- Pull up to `room` tasks for `agent` (its pull text `pull`): `p` = {queue, dlq, task_prefix,
-- low_max, policy}. Returns how many were delivered.
local function pull_ready(c, p, agent, inbox, pull, room, now, now_s)
  local _, round, score, low = string.match(pull, '^(%d+)|([^|]*)|([^|]*)|([^|]*)$')
  if room <= 0 or not round then return 0 end
  local why = (round or '') .. '|pull|' .. (score or '') .. '|'
  local head = redis.call('ZRANGE', p.queue, 0, room - 1, 'WITHSCORES')
  local pulled = 0
  for i = 1, #head, 2 do
    local local_id = head[i]
    local priority, has_constraints = queue_hint(head[i + 1])
    if has_constraints or (low == '1' and priority > p.low_max) then break end
    redis.call('ZREM', p.queue, local_id)
    local task_key = p.task_prefix .. local_id
    local f = redis.call('HMGET', task_key, unpack(DELIVERY_FIELDS))
    local deadline = tonumber(f[7]) or 0
    if f[1] ~= 'queued' then
      -- (a queued id whose record says otherwise: nothing to deliver, as in dispatch.lua)
    elseif deadline > 0 and now >= deadline then
      fail_task(c, load_task(task_key, {'state'}), p.dlq, 'expired',
        'deadline passed while queued', nil, now)
    else
      deliver(c, p.policy, task_key, f, {}, inbox, agent, local_id, now_s, why, ',"pull":true')
      pulled = pulled + 1
    end
  end
  return pulled
end
