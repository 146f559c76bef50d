-- Shared by the capacity scripts (prepended to each, so each call stays one script).
-- Every script takes the same KEYS:
--   KEYS[1] running: zset jid -> lease deadline (epoch seconds) of each copy running
--   KEYS[2] queued: zset jid -> reservation deadline of each copy enqueued, not started
--   KEYS[3] state: hash of what the gauges show (max_running_jobs,
--           remaining_work_count, updated_at)
-- and starts its ARGV with ARGV[1] now (epoch seconds, from limitd.clock) and ARGV[2]
-- max_running_jobs (read from the job at this call).
-- Every key expires a day after its last change: a job class that is gone leaves
-- nothing behind.
local KEEP_SECONDS = 86400

-- Entries whose lease ran out belong to copies that died without telling (SIGKILL,
-- a lost connection) or were lost before starting: they hold no capacity.
local function prune(now)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
end

local function note_state(now, maximum)
  redis.call('HSET', KEYS[3], 'max_running_jobs', maximum, 'updated_at', now)
  for i = 1, 3 do
    redis.call('EXPIRE', KEYS[i], KEEP_SECONDS)
  end
end
