-- fair_clear: drop every job waiting in a fair queue's tenant lines (the queue's own
-- list is dropped by the caller in the same transaction's spirit: Queue.clear).
--
-- KEYS[1]  the fair queue's base (limitd.keys.fair_queue); its lines are built from it
--          (fair_lib.lua): their tenants are only known from <base>:backlog
--
-- Returns the number of jobs dropped. Tenant slots of jobs still running stay, so their
-- acknowledgements free them as usual; turns, backlog and the waiting count go.
--
-- Why atomic: a fetch in the middle would take a turn whose line is half gone.
local fk = fair_library().keys(KEYS[1], nil)
local dropped = 0
for _, tenant in ipairs(redis.call('ZRANGE', fk.backlog, 0, -1)) do
  dropped = dropped + redis.call('LLEN', fk.line .. tenant)
  redis.call('DEL', fk.line .. tenant)
end
redis.call('DEL', fk.turns, fk.backlog, fk.head)
redis.call('HDEL', fk.state, 'jobs')
return dropped
