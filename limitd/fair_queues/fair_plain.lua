-- fair_plain: make a fair queue plain again, without stranding its jobs: every job
-- waiting in a tenant's line goes back to the queue's own list, then the lines and
-- their state go.
--
-- KEYS[1]  queue:<name>        the queue's list (fetchers take from the right)
-- KEYS[2]  limitd:fair_queues  hash queue -> "fair", "fair/<tenant limit>" or "off"
-- KEYS[3]  the fair queue's base (limitd.keys.fair_queue); its lines are built from it
--          (fair_lib.lua): their tenants are only known from <base>:backlog
-- ARGV[1]  the queue name
--
-- Returns the number of jobs moved back.
--
-- The jobs go back in the order turns would have given them, a round at a time: the
-- oldest job of each tenant (tenants by their next turn, then those at their limit),
-- then the next of each, and so on, all ahead of the arrivals not yet sorted (they are
-- newer). Jobs running from a line are settled as plain jobs later: their tenant
-- slots go with the state.
--
-- Why atomic: a fetch between two steps would sort new arrivals into lines that are
-- being emptied, or take a turn from a tenant whose line is gone.
local fk = fair_library().keys(KEYS[3], nil)
local tenants = redis.call('ZRANGE', fk.turns, 0, -1)
local seen = {}
for _, tenant in ipairs(tenants) do seen[tenant] = true end
for _, tenant in ipairs(redis.call('ZRANGE', fk.backlog, 0, -1)) do
  if not seen[tenant] then tenants[#tenants + 1] = tenant end
end
local lines = {}
for k, tenant in ipairs(tenants) do
  lines[k] = redis.call('LRANGE', fk.line .. tenant, 0, -1) -- newest first
end
-- Round r takes each line's r-th oldest job; RPUSH puts each at the fetch end, so the
-- rounds are pushed last first and, within a round, the last tenant first.
local moved, rounds = 0, 0
for _, line in ipairs(lines) do rounds = math.max(rounds, #line) end
for round = rounds, 1, -1 do
  for k = #lines, 1, -1 do
    local line = lines[k]
    local job = line[#line - round + 1]
    if job then
      redis.call('RPUSH', KEYS[1], job)
      moved = moved + 1
    end
  end
end
for _, tenant in ipairs(tenants) do redis.call('DEL', fk.line .. tenant) end
redis.call('DEL', fk.turns, fk.backlog, fk.state, fk.head) -- the weights stay, for a next time
redis.call('HSET', KEYS[2], ARGV[1], 'off')
return moved
