-- Record one call in a sliding-window limiter, if fewer than `limit` calls were made in
-- the last interval.
-- KEYS[1] window: zset token -> call time
-- KEYS[2] the limiter's stats hash
-- KEYS[3] the index of limiters
-- ARGV: see limiter_lib.lua; ARGV[3] is the interval in seconds.
-- Returns {1, 0} when recorded, {0, ms until the oldest call leaves the window}.
-- Atomic: trimming, counting and adding must see one state, or two callers could both
-- take the last place. Cost: O(log N) for the trim and the add, O(1) for ZCARD.
local now, limit, interval = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
-- A call made exactly one interval ago no longer counts.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - interval)
local allowed, wait = 0, 0
if redis.call('ZCARD', KEYS[1]) < limit then
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  redis.call('PEXPIRE', KEYS[1], math.ceil(interval * 1000) + 1000)
  allowed = 1
else
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  wait = ms_until(tonumber(oldest[2]) + interval, now)
end
note_call(KEYS[2], KEYS[3], allowed)
return {allowed, wait}
