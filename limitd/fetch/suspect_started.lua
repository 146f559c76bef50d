-- suspect_started: a capsule is about to run the suspect it holds. From now on a crash of
-- the capsule is charged to this job alone (see reap_capsule.lua).
--
-- KEYS[1]  limitd:recoveries  hash of suspects (see limit_fetch.lua)
-- ARGV[1]  the capsule id
-- ARGV[2]  sha1 of the job
--
-- Returns 1 if the capsule still held the job as its suspect, else 0 (it was reaped
-- meanwhile, or the job is no suspect of it): then nothing is written.
--
-- Why atomic: the mark must be written only while the hold it refines exists; a reaper
-- that removed the hold between a read and a write would leave a mark nobody clears.
if redis.call('HGET', KEYS[1], 'held:' .. ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 'running:' .. ARGV[1], ARGV[2])
return 1
