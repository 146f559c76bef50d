-- suspect_cleared: a suspect completed (whatever its outcome) or was buried: forget what
-- was charged to it, and release the capsule's hold on it, so that a crash after this
-- moment is not charged to a job that is over. Releasing the hold is when the suspects
-- the capsule passed over (to the back of their queue) may be taken again: a wake-up
-- says so, or its idle threads, parked when the fetch that passed over them gave them
-- nothing, would wait for their next poll.
--
-- KEYS[1]  limitd:recoveries  hash of suspects (see limit_fetch.lua)
-- ARGV[1]  the capsule id
-- ARGV[2]  sha1 of the job
-- ARGV[3]  the wake-up channel
-- ARGV[4]  the job's queue name
--
-- Returns 1 if the capsule held the job as its suspect, else 0.
--
-- Why atomic: the hold is released only if it is still this job's; a compare and a
-- delete apart could release a hold the same capsule has taken on another suspect.
local id = ARGV[2]
redis.call('HDEL', KEYS[1], id, id .. ':alone', id .. ':error')
local held_field = 'held:' .. ARGV[1]
if redis.call('HGET', KEYS[1], held_field) ~= id then
  return 0
end
redis.call('HDEL', KEYS[1], held_field, 'running:' .. ARGV[1])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
