-- iteration_save: an iterable job records where it is (after an item, or as a run
-- ends) and learns whether it was cancelled meanwhile.
--
-- KEYS[1]  limitd:iteration:<jid>  hash (see iteration_begin.lua)
-- KEYS[2]  limitd:cancel:<jid>     string: set by a cancel
-- ARGV[1]  the cursor of the last item done, JSON ("" leaves the saved one)
-- ARGV[2]  items done, all runs
-- ARGV[3]  runtime, seconds, all runs
-- ARGV[4]  state: running, interrupted, failed, completed, cancelled or expired
-- ARGV[5]  now, epoch seconds
-- ARGV[6]  seconds the state is kept after this write
--
-- Returns 1 if the job was cancelled, else 0. A cancelled state also drops the cancel
-- flag, which has done its work.
--
-- Atomic so that the cancel read belongs to the write: a cancel that lands after this
-- call is seen by the next one, never lost between the two.
if ARGV[1] ~= '' then
  redis.call('HSET', KEYS[1], 'cursor', ARGV[1])
end
redis.call('HSET', KEYS[1], 'items', ARGV[2], 'runtime', ARGV[3], 'state', ARGV[4],
  'updated_at', ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[6])
if ARGV[4] == 'cancelled' then
  redis.call('HSET', KEYS[1], 'cancelled_at', ARGV[5])
  redis.call('DEL', KEYS[2])
  return 1
end
return redis.call('EXISTS', KEYS[2])
