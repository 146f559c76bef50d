-- Shared by the acquire scripts (prepended to each, so each call stays one script).
-- Every acquire script takes the same ARGV:
--   ARGV[1] now (epoch seconds, float, from limitd.clock)
--   ARGV[2] limit (count)
--   ARGV[3] period in seconds (the interval, or the lock timeout of a concurrent limiter)
--   ARGV[4] token: unique per call (the holder of a concurrent slot, a window's member)
--   ARGV[5] attempt: 1 for the first try of a check, 2 and more while it waits
--   ARGV[6] milliseconds waited so far by this check
--   ARGV[7] ttl in seconds of the limiter's stats hash and of the index
--   ARGV[8] limiter name (member of the index)
--   ARGV[9] kind (stored in the stats hash for the listing)
--   ARGV[10] end of the current interval (bucket only; epoch seconds)
-- and replies {1, 0} when the call may go on, {0, ms} when it may not, ms being how
-- long until room may appear (a hint: the caller sleeps at most that long).

-- Statistics and the index, written in the same script as the check so that counting
-- a call costs no round trip of its own. The stats hash and the index are renewed by
-- every use and expire ARGV[7] seconds after the last one.
local function note_call(stats, index, allowed)
  local attempt = tonumber(ARGV[5])
  if attempt == 1 then
    redis.call('HSET', stats, 'kind', ARGV[9], 'limit', ARGV[2], 'period', ARGV[3])
    redis.call('HINCRBY', stats, 'calls', 1)
  end
  if allowed == 1 then
    if attempt == 1 then
      redis.call('HINCRBY', stats, 'immediate', 1)
    else
      redis.call('HINCRBY', stats, 'waited', 1)
      redis.call('HINCRBY', stats, 'wait_ms', ARGV[6])
    end
  end
  redis.call('EXPIRE', stats, ARGV[7])
  redis.call('ZADD', KEYS[#KEYS], ARGV[1], ARGV[8])
  redis.call('EXPIRE', KEYS[#KEYS], ARGV[7])
end

-- Milliseconds (at least 1) until epoch time `at`, seen from `now`.
local function ms_until(at, now)
  return math.max(1, math.ceil((at - now) * 1000))
end
