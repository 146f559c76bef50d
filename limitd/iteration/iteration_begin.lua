-- iteration_begin: an iterable job starts a run: count the run, mark it running, and
-- read where the last run stopped and whether the job was cancelled.
--
-- KEYS[1]  limitd:iteration:<jid>  hash: class, state, cursor (JSON), items, runs,
--          runtime (seconds, all runs), started_at, updated_at, cancelled_at
-- KEYS[2]  limitd:cancel:<jid>     string: set by a cancel (limitd cancel, api.cancel)
-- ARGV[1]  the job's class
-- ARGV[2]  now, epoch seconds
-- ARGV[3]  seconds the state is kept after its last write
--
-- Returns {state before this run ("" for a first run), cursor JSON or "", items done,
-- runs counting this one, runtime so far, 1 if cancelled else 0}. A job that completed,
-- was cancelled or expired already (a copy run again after a crash between its end and
-- its acknowledgement) is not marked running again: its state is returned as it is.
--
-- Atomic so that what the run resumes from and the cancel it obeys are read in the same
-- instant as the run is counted, in one round trip.
local state = redis.call('HGET', KEYS[1], 'state') or ''
local cancelled = redis.call('EXISTS', KEYS[2])
local fields = redis.call('HMGET', KEYS[1], 'cursor', 'items', 'runs', 'runtime')
if state == 'completed' or state == 'cancelled' or state == 'expired' then
  return {state, fields[1] or '', fields[2] or '0', fields[3] or '0', fields[4] or '0', cancelled}
end
local runs = redis.call('HINCRBY', KEYS[1], 'runs', 1)
redis.call('HSET', KEYS[1], 'class', ARGV[1], 'state', 'running', 'updated_at', ARGV[2])
redis.call('HSETNX', KEYS[1], 'started_at', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {state, fields[1] or '', fields[2] or '0', tostring(runs), fields[4] or '0', cancelled}
