-- Pour one call into a leaky bucket of size `limit` that drains `limit` calls per
-- interval, if it does not overflow: a burst of `limit`, then a steady rate.
-- KEYS[1] state: hash with `level` (calls in the bucket) and `at` (when level was set)
-- KEYS[2] the limiter's stats hash
-- KEYS[3] the index of limiters
-- ARGV: see limiter_lib.lua; ARGV[3] is the interval in seconds.
-- Returns {1, 0} when poured, {0, ms until one call's room has drained}.
-- Atomic: draining, checking and pouring must see one level, or two callers could
-- both fill the last place. O(1) state whatever the limit.
local now, limit, interval = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local rate = limit / interval
local state = redis.call('HMGET', KEYS[1], 'level', 'at')
local level = tonumber(state[1]) or 0
local at = tonumber(state[2]) or now
level = math.max(0, level - math.max(0, now - at) * rate)
local allowed, wait = 0, 0
-- The tolerance absorbs float error in level (60 calls per 60 s: exact; 100 per 60 s: not).
if level + 1 <= limit + 1e-9 then
  level = level + 1
  redis.call('HSET', KEYS[1], 'level', level, 'at', now)
  -- Once drained, the state says nothing a missing key would not.
  redis.call('PEXPIRE', KEYS[1], math.ceil(level / rate * 1000) + 1000)
  allowed = 1
else
  wait = math.max(1, math.ceil((level + 1 - limit) / rate * 1000))
end
note_call(KEYS[2], KEYS[3], allowed)
return {allowed, wait}
