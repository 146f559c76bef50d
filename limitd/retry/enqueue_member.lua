-- enqueue_member: move one job from a sorted set (schedule or retry) to its queue.
--
-- KEYS[1]  the sorted set the job waits in (schedule | retry | dead)
-- KEYS[2]  the set of known queue names (queues)
-- KEYS[3]  the job's queue list (queue:<name>)
-- ARGV[1]  the member exactly as stored in KEYS[1]
-- ARGV[2]  the payload to push (the member with a fresh enqueued_at)
-- ARGV[3]  the queue name, for KEYS[2]
-- ARGV[4]  the wake-up channel (limitd:wake): idle capsules fetch the job at once
--
-- Returns 1 if this call moved the job, 0 if another poller or operator took it first.
--
-- Why atomic: removing and pushing in two calls can lose the job (crash in between)
-- or push it twice (two pollers both read it before either removed it). ZREM decides
-- which poller owns the job; only that one pushes it.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('SADD', KEYS[2], ARGV[3])
redis.call('LPUSH', KEYS[3], ARGV[2])
redis.call('PUBLISH', ARGV[4], ARGV[3])
return 1
