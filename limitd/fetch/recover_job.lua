-- recover_job: give a job whose outcome could not be recorded back to the front of its
-- queue, and count that as one recovery of the job.
--
-- KEYS[1]  limitd:capsule:<id>:inprogress:<queue>  (the entry proves this capsule holds it)
-- KEYS[2]  queue:<queue>
-- KEYS[3]  limitd:busy        hash queue -> jobs in progress
-- KEYS[4]  limitd:recoveries  hash sha1(job) -> recoveries, sha1(job):error -> last reason
-- ARGV[1]  the job exactly as fetched
-- ARGV[2]  the queue name
-- ARGV[3]  why it is given back (kept as the job's last recovery reason)
-- ARGV[4]  how long (seconds) the recoveries hash outlives its last change
-- ARGV[5]  the wake-up channel
--
-- Returns the job's recoveries so far, or 0 if this capsule no longer held it (it was
-- reaped, and counted, already).
--
-- Why atomic: the entry leaves the in-progress list, its slot is freed, it goes back to
-- its queue and its count grows together, so a reaper running at the same moment either
-- finds the entry (and this call finds nothing) or not: the job is returned and counted
-- exactly once, and the busy count stays equal to the in-progress entries.
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then
  return 0
end
if redis.call('HINCRBY', KEYS[3], ARGV[2], -1) < 0 then
  redis.call('HSET', KEYS[3], ARGV[2], 0)
end
redis.call('RPUSH', KEYS[2], ARGV[1])
local id = redis.sha1hex(ARGV[1])
local count = redis.call('HINCRBY', KEYS[4], id, 1)
redis.call('HSET', KEYS[4], id .. ':error', ARGV[3])
redis.call('EXPIRE', KEYS[4], ARGV[4])
redis.call('PUBLISH', ARGV[5], ARGV[2])
return count
