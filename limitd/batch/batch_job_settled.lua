-- Record how one run of a batch job ended, then fire what became true. Idempotent per
-- jid: a job that runs twice (crash recovery) is counted once, because only a jid still
-- in a set moves a counter.
-- KEYS[1..4] the batch; KEYS[5] the set of queue names
-- ARGV[1] jid  ARGV[2] "success", "failure" (will retry) or "death" (will not run again)
-- ARGV[3] error text ("" on success)  ARGV[4] now  ARGV[5] the wake-up channel
-- Returns 1 when recorded, 0 when the jid was not pending (a repeat), -1 when the batch
-- is unknown (expired, or pushed by another system).
local k = {KEYS[1], KEYS[2], KEYS[3], KEYS[4]}
if redis.call('EXISTS', k[1]) == 0 then return -1 end
local jid = ARGV[1]
local recorded = 1
if ARGV[2] == 'success' then
  if redis.call('SREM', k[2], jid) == 1 then
    redis.call('HINCRBY', k[1], 'pending', -1)
  else
    recorded = 0
  end
  redis.call('SREM', k[3], jid)
  redis.call('HDEL', k[4], jid)
elseif redis.call('SISMEMBER', k[2], jid) == 0 then
  return 0 -- a late failure of a run that already succeeded changes nothing
else
  redis.call('SREM', k[3], jid)
  redis.call('HSET', k[4], jid, ARGV[3])
  if ARGV[2] == 'death' and redis.call('HSETNX', k[1], 'death_at', ARGV[4]) == 1 then
    push_callbacks(k, 'death', ARGV[4], KEYS[5], ARGV[5])
  end
end
settle_batch(k, ARGV[4], KEYS[5], ARGV[5])
return recorded
