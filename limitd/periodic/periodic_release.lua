-- periodic: give a claimed tick back after its push failed.
--
-- KEYS[1]  limitd:periodic:<name>  hash (see periodic_claim.lua)
-- ARGV[1]  the jid of the failed claim
-- ARGV[2]  last_tick before the claim ('' when the entry had never run)
-- ARGV[3]  last_jid before the claim
-- ARGV[4]  last_run_at before the claim
--
-- Returns 1 when the claim was given back, 0 when the entry has moved on since (another
-- scheduler claimed a later tick: that one stays).
--
-- Why atomic: compare-and-set on last_jid; restoring without the comparison could undo
-- a later tick that another scheduler claimed meanwhile, and run it twice.
local key = KEYS[1]
if redis.call('HGET', key, 'last_jid') ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('HDEL', key, 'last_tick', 'last_jid', 'last_run_at')
else
  redis.call('HSET', key, 'last_tick', ARGV[2], 'last_jid', ARGV[3], 'last_run_at', ARGV[4])
end
return 1
