-- Take a unique job's lock, or count the duplicate that could not take it.
-- KEYS[1] the lock (limitd:unique:<class>:<queue>:<args digest>)
-- KEYS[2] the counter of skipped duplicates
-- ARGV[1] jid of the job asking (the lock's value, so only it can release the lock)
-- ARGV[2] lifetime in milliseconds
-- Returns 1 when the lock was taken (or this jid already holds it: a push tried again
-- after its write failed, by the failover retry or reliable push, is not its own
-- duplicate), 0 when another job holds it.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
redis.call('INCR', KEYS[2])
return 0
