-- Extend the leases of the copies one process runs (its lease keeper's beat).
-- KEYS[1] running: zset jid -> lease deadline (see capacity_lib.lua)
-- ARGV[1] now; ARGV[2] the new deadline (epoch seconds); ARGV[3..] the jids
-- Returns how many leases were extended. A lease that already ran out is not renewed:
-- its place may have gone to another copy, and max_running_jobs must hold.
-- Atomic: checking a lease is still valid and moving its deadline is one step.
local now, renewed = tonumber(ARGV[1]), 0
for i = 3, #ARGV do
  local deadline = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if deadline and tonumber(deadline) > now then
    redis.call('ZADD', KEYS[1], ARGV[2], ARGV[i])
    renewed = renewed + 1
  end
end
return renewed
