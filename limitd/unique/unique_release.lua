-- Release a unique job's lock, but only if this job still holds it: after the lock
-- expired another job may have taken it, and that job's lock must stay.
-- KEYS[1] the lock
-- ARGV[1] jid of the job releasing
-- Returns 1 when the lock was deleted, 0 when it was gone or held by another job.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
