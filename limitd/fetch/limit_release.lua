-- limit_release: a capsule is done with a job (acknowledge) or gives it back (requeue):
-- remove it from the capsule's in-progress list and free its busy slot.
--
-- KEYS[1]  limitd:capsule:<id>:inprogress:<queue>
-- KEYS[2]  limitd:busy   hash queue -> jobs in progress
-- KEYS[3]  limitd:limits hash queue -> global limit
-- KEYS[4]  queue:<queue>
-- ARGV[1]  the job, exactly as fetched
-- ARGV[2]  the queue name
-- ARGV[3]  "requeue" to push the job back to the front of its queue, "ack" otherwise
-- ARGV[4]  the wake-up channel (limitd:wake)
--
-- Returns 1 if the job was this capsule's to release, 0 if it was not in the list.
--
-- Why atomic: the in-progress entry is the proof of ownership. A capsule that was reaped
-- (its jobs already requeued and its slots freed by another process) finds nothing to
-- remove, so its late ack frees no slot it no longer holds and its requeue pushes no
-- duplicate. Removing the entry and freeing the slot together keeps the busy count equal
-- to the number of in-progress entries.
local removed = redis.call('LREM', KEYS[1], 1, ARGV[1])
if removed == 0 then
  return 0
end
if redis.call('HINCRBY', KEYS[2], ARGV[2], -1) < 0 then
  redis.call('HSET', KEYS[2], ARGV[2], 0)
end
if ARGV[3] == 'requeue' then
  redis.call('RPUSH', KEYS[4], ARGV[1])
  redis.call('PUBLISH', ARGV[4], ARGV[2])
elseif tonumber(redis.call('HGET', KEYS[3], ARGV[2])) and redis.call('LLEN', KEYS[4]) > 0 then
  -- A slot of a limited queue with a backlog just opened: wake idle fetchers.
  redis.call('PUBLISH', ARGV[4], ARGV[2])
end
return 1
