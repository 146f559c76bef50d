-- fair_lib: the lines of a fair queue, shared by the limit fetch and the fair queue
-- admin scripts (prepended to them: each call stays one script).
--
-- Producers push to a fair queue as to any other (LPUSH queue:<name>: Ruby clients
-- too). The fetch *sorts* those arrivals into one line per tenant (the job's
-- ``fair_tenant`` field; jobs without one share the tenant ""), and takes jobs by
-- turns: the tenant whose turn is earliest in virtual time gives one job, and its next
-- turn comes 1 / weight later. A tenant that gets work after being idle takes its turn
-- at the current virtual time, so it goes next, before a tenant with 20,000 jobs
-- waiting gives its next one; a tenant alone takes every turn (nothing waits while
-- work does). With a tenant limit, a tenant running that many jobs loses its turns
-- until one of them is settled.
--
-- Keys, from the fair queue's base B (built by limitd.keys; in a cluster it carries the
-- queue's hash tag, so every one of them is on the queue's shard):
--   B:turns    zset tenant -> virtual time of its next turn (tenants with jobs and room)
--   B:backlog  zset tenant -> jobs waiting in its line
--   B:state    hash clock (virtual time of the last turn), jobs (in all lines),
--              w:<tenant> (weight, default 1), b:<tenant> (jobs running),
--              r:<job id> (the tenant of a running job: its jid, or its SHA-1)
--   B:t:<tenant>  list, the tenant's line: newest at the left, next at the right
-- These names are built here, from B and the tenant: which tenants come next is only
-- known inside the script, from B:turns. B itself is passed by the caller.

local FAIR_TENANT_MAX = 1024 -- bytes; the client refuses longer, the sort shares ""

local function fair_keys(base, limit)
  return {turns = base .. ':turns', backlog = base .. ':backlog', state = base .. ':state',
          line = base .. ':t:', limit = limit}
end

-- The tenant of a job as pushed, and the id its running slot is kept by.
local function fair_job(job)
  local ok, decoded = pcall(cjson.decode, job)
  local tenant, id = '', nil
  if ok and type(decoded) == 'table' then
    local found = decoded.fair_tenant
    if type(found) == 'string' and #found <= FAIR_TENANT_MAX then tenant = found end
    if type(decoded.jid) == 'string' and decoded.jid ~= '' then id = decoded.jid end
  end
  return tenant, id or redis.sha1hex(job)
end

local function fair_clock(fk)
  if fk.clock == nil then
    fk.clock = tonumber(redis.call('HGET', fk.state, 'clock')) or 0
  end
  return fk.clock
end

local function fair_has_room(fk, tenant)
  return not fk.limit
    or (tonumber(redis.call('HGET', fk.state, 'b:' .. tenant)) or 0) < fk.limit
end

-- Put a job in its tenant's line, at the back (a new one) or the front (one given
-- back unfinished); a tenant whose line was empty gets a turn now, if it has room.
local function fair_enter(fk, tenant, job, front)
  local length = redis.call(front and 'RPUSH' or 'LPUSH', fk.line .. tenant, job)
  redis.call('ZINCRBY', fk.backlog, 1, tenant)
  redis.call('HINCRBY', fk.state, 'jobs', 1)
  if length == 1 and fair_has_room(fk, tenant) then
    redis.call('ZADD', fk.turns, 'NX', fair_clock(fk), tenant)
  end
end

-- A running job (taken from a line) is done or given back: free its tenant's slot, and
-- give the tenant its turn back if the limit had taken it. Returns the tenant (nil if
-- the job was not running from a line) and whether a turn was given back.
local function fair_release(fk, id)
  local tenant = redis.call('HGET', fk.state, 'r:' .. id)
  if not tenant then return nil, false end
  redis.call('HDEL', fk.state, 'r:' .. id)
  local running = redis.call('HINCRBY', fk.state, 'b:' .. tenant, -1)
  if running <= 0 then redis.call('HDEL', fk.state, 'b:' .. tenant) end
  if fk.limit and running < fk.limit
      and (tonumber(redis.call('ZSCORE', fk.backlog, tenant)) or 0) > 0 then
    return tenant, redis.call('ZADD', fk.turns, 'NX', fair_clock(fk), tenant) == 1
  end
  return tenant, false
end

-- Sort up to ``count`` arrivals (oldest first) into their tenants' lines. A job that
-- was running (a reaped process's, or one requeued unsettled) goes back to the front
-- of its tenant's line, its slot freed: that is how a dead process's tenant slots are
-- reaped.
local function fair_sort(fk, queue_key, count)
  if count <= 0 then return end
  for _, job in ipairs(redis.call('RPOP', queue_key, count)) do
    local tenant, id = fair_job(job)
    local was = fair_release(fk, id)
    fair_enter(fk, was or tenant, job, was ~= nil)
  end
end

-- The next job by turns, and its tenant; nil when no tenant has a turn.
local function fair_pop(fk)
  for _ = 1, 100 do
    local turn = redis.call('ZRANGE', fk.turns, 0, 0, 'WITHSCORES')
    if #turn == 0 then return nil end
    local tenant, at = turn[1], tonumber(turn[2])
    local job = redis.call('RPOP', fk.line .. tenant)
    if job then
      fk.clock = at
      redis.call('HSET', fk.state, 'clock', at)
      redis.call('HINCRBY', fk.state, 'jobs', -1)
      if tonumber(redis.call('ZINCRBY', fk.backlog, -1, tenant)) <= 0 then
        redis.call('ZREM', fk.backlog, tenant)
        redis.call('ZREM', fk.turns, tenant)
      else
        local weight = tonumber(redis.call('HGET', fk.state, 'w:' .. tenant)) or 1
        redis.call('ZADD', fk.turns, at + 1 / weight, tenant)
      end
      return job, tenant
    end
    redis.call('ZREM', fk.turns, tenant) -- a turn without a line (cleared meanwhile)
    redis.call('ZREM', fk.backlog, tenant)
  end
  return nil
end

-- A job taken from its line runs: count it against its tenant (which loses its turns
-- at its limit).
local function fair_hold(fk, job, tenant)
  local _, id = fair_job(job)
  redis.call('HSET', fk.state, 'r:' .. id, tenant)
  local running = redis.call('HINCRBY', fk.state, 'b:' .. tenant, 1)
  if fk.limit and running >= fk.limit then redis.call('ZREM', fk.turns, tenant) end
end

-- Whether a fair queue has a job a turn could give now.
local function fair_waiting(fk)
  return redis.call('EXISTS', fk.turns) == 1
end
