-- enqueue_due: move a page of due jobs from a sorted set (schedule or retry) to their
-- queues, in one call: what enqueue_member.lua does for one job, for many.
--
-- KEYS[1]       the sorted set the jobs wait in (schedule | retry)
-- KEYS[2]       the set of known queue names (queues)
-- KEYS[2 + q]   the q-th queue list of this page (queue:<name>), q = 1..Q
-- ARGV[1]       the wake-up channel (limitd:wake): idle capsules fetch the jobs at once
-- ARGV[2]       Q, the number of queues
-- ARGV[2 + q]   the q-th queue's name
-- ARGV[2 + Q + 3j - 2], ARGV[2 + Q + 3j - 1], ARGV[2 + Q + 3j]  for the j-th job: the
--               member exactly as stored in KEYS[1], the payload to push (the member with
--               a fresh enqueued_at), and its queue's number q
--
-- Returns how many of the jobs this call moved (a job another poller or an operator
-- took first is skipped).
--
-- Why atomic: per job, as in enqueue_member.lua, the ZREM decides which poller owns it,
-- and only the owner pushes it, in the same step: a job is never lost between the two
-- or pushed twice. Moving a page per call instead of a job per call is what lets a burst
-- of jobs due at the same second reach their queues as fast as capsules can run them.
local queues = tonumber(ARGV[2])
local bodies = {}
local moved = 0
for j = 1, (#ARGV - 2 - queues) / 3 do
  local at = 2 + queues + 3 * j
  if redis.call('ZREM', KEYS[1], ARGV[at - 2]) == 1 then
    local q = tonumber(ARGV[at])
    bodies[q] = bodies[q] or {}
    bodies[q][#bodies[q] + 1] = ARGV[at - 1]
    moved = moved + 1
  end
end
for q = 1, queues do
  if bodies[q] then
    redis.call('SADD', KEYS[2], ARGV[2 + q])
    -- LPUSH of many values pushes them in the order given, as one LPUSH each would.
    for first = 1, #bodies[q], 1000 do
      redis.call('LPUSH', KEYS[2 + q], unpack(bodies[q], first, math.min(first + 999, #bodies[q])))
    end
    redis.call('PUBLISH', ARGV[1], ARGV[2 + q])
  end
end
return moved
