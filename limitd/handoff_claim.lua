-- handoff_claim: claim hand-off entries nobody is pushing (cluster mode; see
-- limitd/handoff.py).
--
-- KEYS[1]  the hand-off set (limitd:moving): job payload -> claim time (unclaimed:
--          far in the past)
-- ARGV[1]  now (epoch seconds): the claim time written
-- ARGV[2]  entries claimed at or before this time are stalled and claimed again
-- ARGV[3]  the most entries to claim
--
-- Returns the entries claimed, oldest score first, for the caller to push.
--
-- Why atomic: reading and re-scoring in one step means two processes never claim the
-- same entry at once (the second finds it claimed just now).
local found = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, ARGV[3])
for _, member in ipairs(found) do
  redis.call('ZADD', KEYS[1], ARGV[1], member)
end
return found
