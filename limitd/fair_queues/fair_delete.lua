-- fair_delete: remove one waiting job from a tenant's line (an operator's delete), and
-- keep the line's counts true.
--
-- KEYS[1]  the fair queue's base (limitd.keys.fair_queue); the line's name is built
--          from it and the tenant (fair_lib.lua)
-- ARGV[1]  the tenant, ARGV[2] the job exactly as stored
--
-- Returns 1 if the job was removed, 0 if a fetch (or another operator) took it first.
--
-- Why atomic: a fetch between the LREM and the counts would find a tenant with a turn
-- and an empty line.
local fk = fair_library().keys(KEYS[1], nil)
local tenant = ARGV[1]
if redis.call('LREM', fk.line .. tenant, 1, ARGV[2]) == 0 then
  return 0
end
redis.call('HINCRBY', fk.state, 'jobs', -1)
if redis.call('EXISTS', fk.line .. tenant) == 0 then -- a shorter line keeps its score
  redis.call('ZREM', fk.backlog, tenant)
  redis.call('ZREM', fk.turns, tenant)
  redis.call('HDEL', fk.head, tenant)
end
return 1
