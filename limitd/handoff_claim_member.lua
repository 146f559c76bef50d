-- handoff_claim_member: take one job out of a sorted set (schedule or retry) into the hand-off
-- set, for a move to a queue on another shard (cluster mode; see limitd/handoff.py).
--
-- KEYS[1]  the sorted set the job waits in (schedule | retry)
-- KEYS[2]  the hand-off set (limitd:moving): member -> when it was claimed
-- ARGV[1]  the member exactly as stored in KEYS[1]
-- ARGV[2]  now (epoch seconds)
--
-- Returns 1 if this call claimed the job, 0 if another poller or operator took it first.
--
-- Why atomic: ZREM decides which poller owns the job, and the job is never in neither
-- set: a poller that dies after the claim leaves it in the hand-off set, from which
-- any poller pushes it a minute later (both sets carry the {limitd} tag: one slot).
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
