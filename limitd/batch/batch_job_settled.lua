-- Record how runs of a batch's jobs ended (one or more: jobs that finished together are
-- sent as one call), then fire what became true. Idempotent per jid: a job that runs
-- twice (crash recovery) is counted once, because only a jid still in a set moves a
-- counter.
-- KEYS[1..4] the batch; KEYS[5] the set of queue names
-- ARGV[1] the wake-up channel
-- then, per run, 4 arguments: jid; "success", "failure" (will retry) or "death" (will
-- not run again); error text ("" on success); the time it ended
-- Returns one result per run: 1 recorded, 0 a repeat (the jid was not pending), -1 the
-- batch is unknown (expired, or pushed by another system).
local k = {KEYS[1], KEYS[2], KEYS[3], KEYS[4]}
local runs = (#ARGV - 1) / 4
local results = {}
if redis.call('EXISTS', k[1]) == 0 then
  for i = 1, runs do results[i] = -1 end
  return results
end

local has_failures = redis.call('EXISTS', k[4]) == 1
local succeeded = 0

local function record(jid, result, error_text, now)
  if result == 'success' then
    redis.call('SREM', k[3], jid)
    if has_failures then redis.call('HDEL', k[4], jid) end
    if redis.call('SREM', k[2], jid) == 0 then return 0 end
    succeeded = succeeded + 1
    return 1
  end
  if redis.call('SISMEMBER', k[2], jid) == 0 then
    return 0 -- a late failure of a run that already succeeded changes nothing
  end
  redis.call('SREM', k[3], jid)
  redis.call('HSET', k[4], jid, error_text)
  has_failures = true
  if result == 'death' and redis.call('HSETNX', k[1], 'death_at', now) == 1 then
    push_callbacks(k, 'death', now, KEYS[5], ARGV[1])
  end
  return 1
end

local now = ARGV[5]
for i = 1, runs do
  local at = 2 + 4 * (i - 1)
  now = ARGV[at + 3]
  results[i] = record(ARGV[at], ARGV[at + 1], ARGV[at + 2], now)
end
if succeeded > 0 then
  redis.call('HINCRBY', k[1], 'pending', -succeeded) -- once for all the runs
end
settle_batch(k, now, KEYS[5], ARGV[1])
return results
