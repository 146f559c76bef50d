-- recover_job: give a job whose outcome could not be recorded back to the front of its
-- queue, and charge it: its own run failed, so this counts as a crash it was alone in.
--
-- KEYS[1]  limitd:capsule:<id>:inprogress:<queue>  (the entry proves this capsule holds it)
-- KEYS[2]  queue:<queue>
-- KEYS[3]  limitd:busy        hash queue -> jobs in progress
-- KEYS[4]  limitd:recoveries  hash of suspects (see limit_fetch.lua)
-- ARGV[1]  the job exactly as fetched
-- ARGV[2]  the queue name
-- ARGV[3]  why it is given back (kept as the job's last recovery reason)
-- ARGV[4]  how long (seconds) the recoveries hash outlives its last change
-- ARGV[5]  the wake-up channel
-- ARGV[6]  the capsule id (a capsule that held the job as its suspect holds it no more)
--
-- Returns the job's crashes so far, or 0 if this capsule no longer held it (it was
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
redis.call('HINCRBY', KEYS[4], id .. ':alone', 1)
redis.call('HSET', KEYS[4], id .. ':error', ARGV[3])
local held_field = 'held:' .. ARGV[6]
if redis.call('HGET', KEYS[4], held_field) == id then
  redis.call('HDEL', KEYS[4], held_field, 'running:' .. ARGV[6])
end
redis.call('EXPIRE', KEYS[4], ARGV[4])
redis.call('PUBLISH', ARGV[5], ARGV[2])
return count
