-- fair_largest: the tenants with the most jobs waiting in a fair queue's lines, with
-- their lines' true lengths.
--
-- KEYS[1]  the fair queue's base (limitd.keys.fair_queue); the lines are built from it
--          and the tenants (fair_lib.lua)
-- ARGV[1]  how many tenants to return (top)
-- ARGV[2]  at most this many lines to read in one call (a bound on the call's cost)
--
-- Returns a flat list tenant, length, ... largest first, and as its last element 1 if
-- the list is exact, 0 if the bound was met first (then it is the largest of the lines
-- this call read).
--
-- The backlog's scores are upper bounds (each is a line's length when a job last joined
-- it; a take does not write it), so the tenants ranked first by score are read with
-- LLEN and their scores corrected; once the first ``top`` by score are all corrected,
-- no other tenant can hold more than they do. Corrected scores stay: the next call
-- starts from them.
--
-- Why atomic: a job joining a line between its LLEN and the correction would leave a
-- score below what the line holds, and the scores would no longer bound the lines.
local fk = fair_library().keys(KEYS[1], nil)
local top, budget = tonumber(ARGV[1]), tonumber(ARGV[2])
-- Each pass reads a window of the ranking, at least WINDOW wide, and corrects every
-- line of it not read yet: a ranking of one (the metrics' largest tenant) over many
-- drained tenants then takes a pass per WINDOW lines, not one per line.
local WINDOW = 50
local read = {} -- tenant -> the length of its line, for the lines this call read

-- With the bound met: the largest of the lines this call read, and 0 (not sure).
local function largest_read()
  local lengths = {}
  for tenant, length in pairs(read) do lengths[#lengths + 1] = {tenant, length} end
  table.sort(lengths, function(a, b) return a[2] > b[2] end)
  local found = {}
  for i = 1, math.min(top, #lengths) do
    found[#found + 1], found[#found + 2] = lengths[i][1], lengths[i][2]
  end
  found[#found + 1] = 0
  return found
end

while true do
  local ranked = redis.call('ZREVRANGE', fk.backlog, 0, math.max(top, WINDOW) - 1, 'WITHSCORES')
  local first, pending, sure = {}, {}, true
  for i = 1, #ranked, 2 do
    local tenant = ranked[i]
    if not read[tenant] then pending[#pending + 1] = tenant end
    if i < 2 * top then
      first[#first + 1], first[#first + 2] = tenant, ranked[i + 1]
      if not read[tenant] then sure = false end
    end
  end
  if sure then
    first[#first + 1] = 1
    return first
  end
  if budget <= 0 then return largest_read() end
  for i = 1, math.min(#pending, budget) do
    local tenant = pending[i]
    local length = redis.call('LLEN', fk.line .. tenant)
    read[tenant] = length
    if length > 0 then
      redis.call('ZADD', fk.backlog, 'XX', length, tenant)
    else -- not expected (a take that empties a line removes its tenant): made true
      redis.call('ZREM', fk.backlog, tenant)
    end
  end
  budget = budget - #pending
end
