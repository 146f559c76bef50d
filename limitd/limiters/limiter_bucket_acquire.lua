-- Count one call in a bucket limiter's current calendar interval, if it has room.
-- KEYS[1] the interval's counter (its name holds the interval's start)
-- KEYS[2] the limiter's stats hash
-- KEYS[3] the index of limiters
-- ARGV: see limiter_lib.lua; ARGV[3] is the interval, ARGV[10] its end (epoch seconds).
-- Returns {1, 0} when counted, {0, ms until the next interval starts}.
-- Atomic: reading and incrementing the counter must be one step, or two callers could
-- both take the last call of the interval.
local now, limit, finish = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[10])
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
local allowed, wait = 0, 0
if count < limit then
  redis.call('INCR', KEYS[1])
  -- The counter goes with its interval (a second later, for callers slightly behind).
  redis.call('PEXPIRE', KEYS[1], ms_until(finish, now) + 1000)
  allowed = 1
else
  wait = ms_until(finish, now)
end
note_call(KEYS[2], KEYS[3], allowed)
return {allowed, wait}
