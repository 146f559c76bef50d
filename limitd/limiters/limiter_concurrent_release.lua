-- Give back a concurrent limiter's slot and announce it to waiters.
-- KEYS[1] holders: zset token -> lock expiry
-- KEYS[2] wake list: waiters BLPOP on it; one entry per released slot, at most `limit`
-- KEYS[3] the limiter's stats hash
-- ARGV[1] token of the holder
-- ARGV[2] milliseconds the slot was held
-- ARGV[3] limit (the wake list never holds more entries than slots)
-- ARGV[4] lock timeout in milliseconds (the wake list's lifetime)
-- Returns 1 when the slot was released, 0 when its lock had already expired.
-- Atomic: the slot and its announcement go together, so a waiter that found no slot
-- and then blocks on the wake list cannot miss the release (the entry stays there).
local released = redis.call('ZREM', KEYS[1], ARGV[1])
if released == 1 then
  redis.call('LPUSH', KEYS[2], '1')
  redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HINCRBY', KEYS[3], 'holds', 1)
  redis.call('HINCRBY', KEYS[3], 'hold_ms', ARGV[2])
  if released == 0 then
    redis.call('HINCRBY', KEYS[3], 'expired', 1)
  end
end
return released
