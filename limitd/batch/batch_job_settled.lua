-- Record how runs of a batch's jobs ended (one or more: jobs that finished together are
-- sent as one call), then fire what became true. Idempotent per jid: a job that runs
-- twice (crash recovery) is counted once, because only a jid still in a set moves a
-- counter.
-- KEYS[1..4] the batch; KEYS[5] the set of queue names (in cluster mode, the hand-off
--          set, where callbacks go: see batch_lib.lua's push_callbacks)
-- ARGV[1] the wake-up channel
-- then, per run, 4 arguments: jid; "success", "failure" (will retry) or "death" (will
-- not run again); error text ("" on success); the time it ended
-- Returns one result per run: 1 recorded, 0 a repeat (the jid was not pending), -1 the
-- batch is unknown (expired, or pushed by another system).
local k = {KEYS[1], KEYS[2], KEYS[3], KEYS[4]}
local runs = (#ARGV - 1) / 4
local results = {}
local meta = read_meta(k) -- read once, for settle_batch too: recording runs changes none of it
if not meta[5] then
  for i = 1, runs do results[i] = -1 end
  return results
end

-- Successes are the common case and are recorded together, a few commands for all of
-- them instead of a few per job. A failure in between flushes those before it, so
-- runs still take effect in the order they are given.
local successes, success_runs, in_group = {}, {}, {}
local succeeded = 0
local FLUSH_AT = 1000 -- stays well below Lua's limit on unpack()

local function record_successes()
  if #successes == 0 then return end
  local was_pending = redis.call('SMISMEMBER', k[2], unpack(successes))
  redis.call('SREM', k[2], unpack(successes))
  redis.call('SREM', k[3], unpack(successes))
  redis.call('HDEL', k[4], unpack(successes))
  for i, run in ipairs(success_runs) do
    results[run] = was_pending[i]
    succeeded = succeeded + was_pending[i]
  end
  successes, success_runs, in_group = {}, {}, {}
end

local function record_failure(jid, result, error_text, now)
  if redis.call('SISMEMBER', k[2], jid) == 0 then
    return 0 -- a late failure of a run that already succeeded changes nothing
  end
  redis.call('SREM', k[3], jid)
  if redis.call('HSET', k[4], jid, error_text) == 1 and redis.call('TTL', k[4]) == -1 then
    redis.call('EXPIRE', k[4], meta[5]) -- the first failure created the hash
  end
  if result == 'death' and redis.call('HSETNX', k[1], 'death_at', now) == 1 then
    push_callbacks(k, 'death', now, KEYS[5], ARGV[1])
  end
  return 1
end

local now
for run = 1, runs do
  local at = 2 + 4 * (run - 1)
  local jid, result = ARGV[at], ARGV[at + 1]
  now = ARGV[at + 3]
  if result == 'success' then
    if in_group[jid] then
      results[run] = 0 -- the same jid twice in one call: the first run counts
    else
      in_group[jid] = true
      successes[#successes + 1] = jid
      success_runs[#success_runs + 1] = run
      if #successes >= FLUSH_AT then record_successes() end
    end
  else
    record_successes()
    results[run] = record_failure(jid, result, ARGV[at + 2], now)
  end
end
record_successes()
if succeeded > 0 then
  redis.call('HINCRBY', k[1], 'pending', -succeeded) -- once for all the runs
end
settle_batch(k, now, KEYS[5], ARGV[1], meta)
return results
