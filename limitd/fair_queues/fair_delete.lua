-- fair_delete: remove one waiting job from a tenant's line (an operator's delete), and
-- keep the line's counts true.
--
-- KEYS[1]  the fair queue's base (limitd.keys.fair_queue); the line's name is built
--          from it and the tenant (fair_lib.lua)
-- ARGV[1]  the tenant, ARGV[2] the job exactly as stored
--
-- Returns 1 if the job was removed, 0 if a fetch (or another operator) took it first.
--
-- Why atomic: a fetch between the LREM and the counts would pop a line whose backlog
-- says one job more than it holds.
local fk = fair_library().keys(KEYS[1], nil)
local tenant = ARGV[1]
if redis.call('LREM', fk.line .. tenant, 1, ARGV[2]) == 0 then
  return 0
end
redis.call('HINCRBY', fk.state, 'jobs', -1)
if tonumber(redis.call('ZINCRBY', fk.backlog, -1, tenant)) <= 0 then
  redis.call('ZREM', fk.backlog, tenant)
  redis.call('ZREM', fk.turns, tenant)
  redis.call('HDEL', fk.head, tenant)
end
return 1
