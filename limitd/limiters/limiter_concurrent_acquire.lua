-- Take one of a concurrent limiter's `limit` slots, or say how long until a lock expires.
-- KEYS[1] holders: zset token -> expiry of its lock (now + lock timeout)
-- KEYS[2] wake list: one entry per slot released since the limiter was last full
-- KEYS[3] the limiter's stats hash
-- KEYS[4] the index of limiters (zset name -> last use)
-- ARGV: see limiter_lib.lua; ARGV[3] is the lock timeout in seconds.
-- Returns {1, 0} when the slot was taken, {0, ms until the oldest lock expires}.
-- Atomic: pruning expired holders, counting and adding must see one state, or two
-- callers could both take the last slot.
local now, limit, lock = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
-- A holder killed inside its block never releases: its lock runs out here.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local allowed, wait = 0, 0
if redis.call('ZCARD', KEYS[1]) < limit then
  redis.call('ZADD', KEYS[1], now + lock, ARGV[4])
  local lifetime = math.ceil(lock * 1000)
  if redis.call('PTTL', KEYS[1]) < lifetime then
    redis.call('PEXPIRE', KEYS[1], lifetime)
  end
  if redis.call('ZCARD', KEYS[1]) >= limit then
    -- Full: no slot is free, so earlier release announcements wake nobody usefully;
    -- each later release announces itself again.
    redis.call('DEL', KEYS[2])
  end
  allowed = 1
else
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  wait = ms_until(tonumber(oldest[2]), now)
end
note_call(KEYS[3], KEYS[4], allowed)
return {allowed, wait}
