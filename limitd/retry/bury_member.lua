-- bury_member: move a member of a sorted set (schedule or retry) to the dead set.
--
-- KEYS[1]  the sorted set the member sits in (schedule | retry)
-- KEYS[2]  the dead set (dead)
-- ARGV[1]  the member exactly as stored in KEYS[1]
-- ARGV[2]  the dead-set entry (the member itself, or an unreadable one wrapped with the
--          reason)
-- ARGV[3]  now, epoch seconds: the dead-set score
--
-- Returns 1 if this call moved it, 0 if another poller took it first.
-- Why atomic: same reason as enqueue_member; the member must end in exactly one place.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
return 1
