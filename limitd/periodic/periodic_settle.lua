-- periodic: record the jids a claimed tick really enqueued, when they are not the one
-- chosen before the claim (perform_with_capacity picks its own, possibly none).
--
-- KEYS[1]  limitd:periodic:<name>  hash (see periodic_claim.lua)
-- ARGV[1]  the jid of the claim
-- ARGV[2]  the jids enqueued, space-separated ('' for none)
--
-- Returns 1 when recorded, 0 when a later tick was claimed since (its jid stays).
--
-- Why atomic: compare-and-set on last_jid, as periodic_release.lua.
local key = KEYS[1]
if redis.call('HGET', key, 'last_jid') ~= ARGV[1] then
  return 0
end
redis.call('HSET', key, 'last_jid', ARGV[2])
return 1
