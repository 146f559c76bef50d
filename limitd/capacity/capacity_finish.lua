-- A copy is done: free its place and, while work remains, hand a place to its successor.
-- KEYS: see capacity_lib.lua.
-- ARGV[3] the copy's jid
-- ARGV[4] remaining_work_count read after its work, or -1 (it failed: no successor)
-- ARGV[5] the successor's jid
-- ARGV[6] how long the successor's reservation lasts if it never starts (seconds)
-- Returns 1 when the successor's place is reserved (the caller pushes it), else 0.
-- Atomic: freeing the place and reserving it again must be one step, or a refill in
-- between could fill it and the successor would go over max_running_jobs.
local now, maximum, remaining = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
prune(now)
redis.call('ZREM', KEYS[1], ARGV[3])
local reserved = 0
if remaining >= 0 then
  redis.call('HSET', KEYS[3], 'remaining_work_count', remaining)
  local taken = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
  if remaining > 0 and taken < maximum then
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[6]), ARGV[5])
    reserved = 1
  end
end
note_state(now, maximum)
return reserved
