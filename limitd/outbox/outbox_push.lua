-- outbox_push.lua: push one job of the outbox, once.
--
-- KEYS[1]  the row's pushed marker (limitd:outbox:pushed:<jid>:<row id>)
-- KEYS[2]  where the job goes: its queue's list, or the schedule sorted set
-- KEYS[3]  the set of queue names (queues)
-- ARGV[1]  the marker's lifetime, seconds
-- ARGV[2]  the job's JSON
-- ARGV[3]  "" for an immediate job, else the due time of a scheduled one (epoch seconds)
-- ARGV[4]  the queue's name (immediate), added to KEYS[3] and published
-- ARGV[5]  the channel to publish on: the wake channel (immediate) or the due channel
--
-- Returns 1 when it pushed, 0 when the marker said the row was pushed already.
--
-- Atomic because the marker and the push must go together: a relay that pushed a row
-- and died before deleting it leaves the row in the table and the marker in Redis, and
-- the next relay must find the one if and only if the other happened.

if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
    return 0
end
if ARGV[3] == '' then
    redis.call('SADD', KEYS[3], ARGV[4])
    redis.call('LPUSH', KEYS[2], ARGV[2])
    redis.call('PUBLISH', ARGV[5], ARGV[4])
else
    redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
    redis.call('PUBLISH', ARGV[5], ARGV[3])
end
return 1
