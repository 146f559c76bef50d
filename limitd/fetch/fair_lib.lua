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
--   B:backlog  zset tenant -> its line's length when a job last joined it: the
--              tenants with jobs waiting (exactly), each at no less than it holds (a
--              take leaves the score as it was; store.status reads the true lengths
--              of the largest and writes them back)
--   B:state    hash clock (virtual time of the last turn), jobs (in all lines), and
--              with a tenant limit b:<tenant> (jobs running) and r:<sha1 of the job>
--              (the tenant of a running job)
--   B:weights  hash tenant -> turns per round (absent: 1)
--   B:head     hash tenant -> jobs left of the head start it got on becoming active
--   B:t:<tenant>  list, the tenant's line: newest at the left, next at the right
-- These names are built here, from B and the tenant: which tenants come next is only
-- known inside the script, from B:turns. B itself is passed by the caller.
--
-- Cost: sorting reads each arrival's JSON once (cjson) and moves the arrivals of one
-- tenant with one LPUSH; taking a job is a ZRANGE, an RPOP and a ZADD of its tenant's
-- turn, whatever the number of tenants (O(log n) each): the backlog is not written on
-- a take (in the compact encoding of up to 128 tenants, each update of a sorted set
-- rewrites it, which for the backlog was a sixth of a fetch over 100 tenants' turns),
-- only when the take empties the line, which an EXISTS tells; a tenant whose next
-- turns come before anyone else's gives them in one RPOP (and the fetch takes them in
-- one step: fair_run_rest); the head starts are read only while some tenant has one;
-- the clock and the jobs count are written once per call (fair_flush); virtual time
-- is whole numbers (FAIR_TURN). Without a tenant limit nothing is kept per running
-- job, so acknowledging one costs nothing more than in a plain queue.
--
-- The functions are made on first need, by ``fair_library()``, which returns them in a
-- table (once a call: it is kept): making a closure costs Redis about as much as a
-- command, and most calls of the scripts this is prepended to never meet a fair queue.
-- ``fair_setting`` is apart, so that finding a queue plain makes none of them.

local fair_functions = nil -- fair_library's table, once made in this call

local function fair_library()
  if fair_functions then return fair_functions end
  local FAIR_TENANT_MAX = 1024 -- bytes; the client refuses longer, the sort shares ""
  -- A tenant that becomes active (its line was empty) takes up to this many turns' jobs
  -- (times its weight) before anyone's next turn, then joins the rounds: a short burst
  -- is done in one go instead of one job per round, while a tenant with a long backlog
  -- gets no more than any other once its head start is spent.
  local FAIR_HEAD_START = 10
  -- Virtual time counts whole units, FAIR_TURN of them to a turn (one turn per
  -- FAIR_TURN / weight units). A sorted set of up to 128 members (Redis's compact
  -- encoding) keeps a whole-number score as an integer and any other as text, which
  -- every insert among them parses again: with fractions of a turn as scores, parsing
  -- them was a third of what Redis ran for a fetch over 100 tenants' turns. (Times
  -- written by an earlier version, in turns with fractions, are rounded up to whole
  -- units as they are read: after one round of turns every score is whole.)
  local FAIR_TURN = 1048576
  -- New tenants' first turns are spaced this much apart in virtual time, so that those
  -- that became active at the same clock go in the order they came (not by name).
  local FAIR_ENTRY_GAP = 1

  local function fair_keys(base, limit)
    return {turns = base .. ':turns', backlog = base .. ':backlog',
            state = base .. ':state', weights = base .. ':weights',
            head = base .. ':head', line = base .. ':t:', limit = limit, jobs_delta = 0}
  end

  -- The tenant of a job as pushed. limitd's client writes ``fair_tenant`` as the first
  -- key (limitd/fair_queues/middleware.py), so most jobs are read without decoding
  -- them; a job that names no tenant anywhere is not decoded either; others (a Ruby
  -- client's, an escaped value) are decoded whole.
  local function fair_tenant_of(job)
    local first = string.match(job, '^{"fair_tenant":"([^"\\]*)"')
    if first and #first <= FAIR_TENANT_MAX then return first end
    if not first and not string.find(job, '"fair_tenant"', 1, true) then return '' end
    local ok, decoded = pcall(cjson.decode, job)
    if ok and type(decoded) == 'table' then
      local found = decoded.fair_tenant
      if type(found) == 'string' and #found <= FAIR_TENANT_MAX then return found end
    end
    return ''
  end

  -- The queue's counters in B:state (the jobs in all lines, the clock, the last entry
  -- turn), read together on first use in a call: a call that sorts and takes reads them
  -- with one HMGET, and fair_flush writes them back with one HSET.
  local function fair_load(fk)
    if fk.jobs ~= nil then return end
    local found = redis.call('HMGET', fk.state, 'jobs', 'clock', 'entered')
    fk.jobs = tonumber(found[1]) or 0
    if fk.clock == nil then fk.clock = math.ceil(tonumber(found[2]) or 0) end
    if fk.entered == nil then fk.entered = math.ceil(tonumber(found[3]) or 0) end
  end

  -- The jobs in the queue's lines, this call's moves included.
  local function fair_jobs(fk)
    fair_load(fk)
    return fk.jobs + fk.jobs_delta
  end

  local function fair_clock(fk)
    if fk.clock == nil then fair_load(fk) end
    return fk.clock
  end

  -- Whether the queue has weights and whether any tenant is in its head start, asked
  -- once a call, both in one EXISTS while neither is there (a queue's steady rounds,
  -- a tenant alone): turns taken then read no weight and no head start each.
  local function fair_extras(fk)
    local found = redis.call('EXISTS', fk.weights, fk.head)
    if found == 1 then
      fk.weighted = redis.call('EXISTS', fk.weights) == 1
    else
      fk.weighted = found == 2
    end
    fk.any_head = found == 2 or (found == 1 and not fk.weighted)
  end

  local function fair_weight(fk, tenant)
    if fk.weighted == nil then fair_extras(fk) end
    return fk.weighted and tonumber(redis.call('HGET', fk.weights, tenant)) or 1
  end

  local function fair_any_head(fk)
    if fk.weighted == nil then fair_extras(fk) end
    return fk.any_head
  end

  local function fair_has_room(fk, tenant)
    return not fk.limit
      or (tonumber(redis.call('HGET', fk.state, 'b:' .. tenant)) or 0) < fk.limit
  end

  -- The virtual time of a newly active tenant's first turn: now, after those that
  -- became active before it at the same clock.
  local function fair_entry_turn(fk)
    if fk.entered == nil then fair_load(fk) end
    fk.entered = math.max(fair_clock(fk), fk.entered) + FAIR_ENTRY_GAP
    fk.entered_moved = true
    return fk.entered
  end

  -- Put jobs of one tenant in its line, at the back (new ones, oldest first) or the
  -- front (one given back unfinished); a tenant whose line was empty gets a turn now,
  -- if it has room, and its head start.
  local function fair_enter(fk, tenant, jobs, front)
    local push = front and 'RPUSH' or 'LPUSH'
    local length = redis.call(push, fk.line .. tenant, unpack(jobs))
    redis.call('ZADD', fk.backlog, length, tenant)
    fk.jobs_delta = fk.jobs_delta + #jobs
    if length == #jobs then
      local head_start = math.ceil(FAIR_HEAD_START * fair_weight(fk, tenant))
      redis.call('HSET', fk.head, tenant, head_start)
      fk.any_head = true
      if fair_has_room(fk, tenant) then
        redis.call('ZADD', fk.turns, 'NX', fair_entry_turn(fk), tenant)
      end
    end
  end

  -- With a tenant limit: a running job (taken from a line) is done or given back. Free
  -- its tenant's slot, and give the tenant its turn back if the limit had taken it.
  -- Returns the tenant (nil if the job was not running from a line) and whether a turn
  -- was given back.
  local function fair_release(fk, job)
    if not fk.limit then return nil, false end
    local field = 'r:' .. redis.sha1hex(job)
    local tenant = redis.call('HGET', fk.state, field)
    if not tenant then return nil, false end
    redis.call('HDEL', fk.state, field)
    local running = redis.call('HINCRBY', fk.state, 'b:' .. tenant, '-1')
    if running <= 0 then redis.call('HDEL', fk.state, 'b:' .. tenant) end
    if running < fk.limit and redis.call('EXISTS', fk.line .. tenant) == 1 then
      return tenant, redis.call('ZADD', fk.turns, 'NX', fair_clock(fk), tenant) == 1
    end
    return tenant, false
  end

  -- Sort up to ``count`` arrivals (oldest first) into their tenants' lines, each
  -- tenant's in one LPUSH. With a tenant limit, a job that was running (a reaped
  -- process's, or one requeued unsettled) goes back to the front of its tenant's line,
  -- its slot freed: that is how a dead process's tenant slots are reaped.
  local function fair_sort(fk, queue_key, count)
    if count <= 0 then return end
    local by_tenant, order = {}, {}
    for _, job in ipairs(redis.call('RPOP', queue_key, count)) do
      local was = fk.limit and fair_release(fk, job)
      if was then
        fair_enter(fk, was, {job}, true)
      else
        local tenant = fair_tenant_of(job)
        if not by_tenant[tenant] then
          by_tenant[tenant] = {}
          order[#order + 1] = tenant
        end
        local jobs = by_tenant[tenant]
        jobs[#jobs + 1] = job
      end
    end
    for _, tenant in ipairs(order) do
      local jobs = by_tenant[tenant]
      if #jobs <= 1000 then -- one LPUSH (the fetch sorts no more than that per call)
        fair_enter(fk, tenant, jobs, false)
      else
        for first = 1, #jobs, 1000 do
          fair_enter(fk, tenant, {unpack(jobs, first, math.min(first + 999, #jobs))}, false)
        end
      end
    end
  end

  -- How many turns in a row the head tenant (next turn at ``at``, one turn per
  -- ``step``) has before the next tenant's turn at ``after`` (nil: no other tenant): at
  -- least 1.
  local function fair_run_length(at, step, after, most)
    if after == nil then return most end
    return math.max(1, math.min(most, math.ceil((after - at) / step)))
  end

  -- Take ``count`` jobs from the line of ``tenant``, whose turn is at ``at`` (one turn
  -- per ``step``): the line, its backlog, its head start (``head`` jobs left: those are
  -- taken without moving its turn, and its turn moves one step when it is spent) and
  -- its next turn move as ``count`` single turns would. Returns the jobs, oldest first
  -- (fewer if the line was shorter: cleared meanwhile).
  local function fair_take(fk, tenant, at, step, head, count)
    local jobs = redis.call('RPOP', fk.line .. tenant, count)
    if not jobs then return {} end
    fk.jobs_delta = fk.jobs_delta - #jobs
    if #jobs < count or redis.call('EXISTS', fk.line .. tenant) == 0 then
      redis.call('ZREM', fk.backlog, tenant)
      redis.call('ZREM', fk.turns, tenant)
      if head > 0 then redis.call('HDEL', fk.head, tenant) end
    elseif head > #jobs then
      redis.call('HSET', fk.head, tenant, head - #jobs)
    elseif head > 0 then
      redis.call('HDEL', fk.head, tenant)
      redis.call('ZADD', fk.turns, at + step, tenant)
    else
      redis.call('ZADD', fk.turns, at + #jobs * step, tenant)
    end
    return jobs
  end

  -- Up to ``most`` more jobs of the run fair_pop took ahead (the head tenant's next
  -- turns), as that many more fair_pop calls would give them, for a caller that takes
  -- them in one step: the run's jobs and the first and last given now, or nil.
  local function fair_run_rest(fk, most)
    local run = fk.run
    if not run or run.given >= #run.jobs then return nil end
    local from, to = run.given + 1, math.min(#run.jobs, run.given + most)
    run.given = to
    local turns_in = run.head > 0 and 0 or (to - 1) -- a head start keeps its turn
    fk.clock, fk.clock_moved = run.at + turns_in * run.step, true
    return run.jobs, from, to
  end

  -- The next job by turns, and its tenant; nil when no tenant has a turn. ``most``: how
  -- many more jobs the caller may want in this call. A tenant in its head start keeps
  -- its turn while the head start lasts. Several jobs of the head tenant are taken in
  -- one RPOP when they all come before any other tenant's turn (its head start, a
  -- tenant alone, one with a large weight), and handed out one per call from
  -- ``fk.run``; fair_flush puts back those the caller did not want. With a tenant limit
  -- one job at a time: each must be counted against its tenant as it is taken.
  local function fair_pop(fk, most)
    local jobs, from = fair_run_rest(fk, 1)
    if jobs then return jobs[from], fk.run.tenant end
    fk.run = nil
    most = fk.limit and 1 or most or 1
    for _ = 1, 100 do
      -- (the range as text: Redis formats a Lua number argument with "%.17g")
      local turn = redis.call('ZRANGE', fk.turns, '0', '1', 'WITHSCORES')
      if #turn == 0 then return nil end
      local tenant, at, after = turn[1], math.ceil(tonumber(turn[2])), tonumber(turn[4])
      local step = math.max(1, math.floor(FAIR_TURN / fair_weight(fk, tenant)))
      local head, count = 0, nil
      if fair_any_head(fk) then head = tonumber(redis.call('HGET', fk.head, tenant)) or 0 end
      if head > 0 and after == nil then -- alone: a head start gives it nothing more
        redis.call('HDEL', fk.head, tenant)
        head = 0
      end
      if head > 0 then
        count = math.min(head, most)
      else
        count = fair_run_length(at, step, after, most)
      end
      local jobs = fair_take(fk, tenant, at, step, head, count)
      if #jobs > 0 then
        fk.clock, fk.clock_moved = at, true
        if #jobs > 1 then
          fk.run = {tenant = tenant, at = at, step = step, head = head, jobs = jobs,
                    given = 1}
        end
        return jobs[1], tenant
      end
      redis.call('ZREM', fk.turns, tenant) -- a turn without a line (cleared meanwhile)
      redis.call('ZREM', fk.backlog, tenant)
      redis.call('HDEL', fk.head, tenant)
    end
    return nil
  end

  -- Jobs taken ahead by fair_pop that the caller did not want go back to the front of
  -- their tenant's line, with the turn and head start they would have had.
  local function fair_give_back(fk)
    local run = fk.run
    fk.run = nil
    if not run or run.given >= #run.jobs then return end
    local back = {}
    for i = #run.jobs, run.given + 1, -1 do back[#back + 1] = run.jobs[i] end
    local length = redis.call('RPUSH', fk.line .. run.tenant, unpack(back))
    -- the take left the backlog's score, unless it emptied the line and removed it
    if length == #back then redis.call('ZADD', fk.backlog, length, run.tenant) end
    fk.jobs_delta = fk.jobs_delta + #back
    if run.head > 0 then -- still in its head start, at its turn
      redis.call('HSET', fk.head, run.tenant, run.head - run.given)
      fk.any_head = true
      redis.call('ZADD', fk.turns, run.at, run.tenant)
    else
      redis.call('ZADD', fk.turns, run.at + run.given * run.step, run.tenant)
    end
  end

  -- A job taken from its line runs: with a tenant limit, count it against its tenant
  -- (which loses its turns at its limit).
  local function fair_hold(fk, job, tenant)
    if not fk.limit then return end
    redis.call('HSET', fk.state, 'r:' .. redis.sha1hex(job), tenant)
    local running = redis.call('HINCRBY', fk.state, 'b:' .. tenant, '1')
    if running >= fk.limit then redis.call('ZREM', fk.turns, tenant) end
  end

  -- Write what this call changed of the counters, once: one HSET (the jobs count as
  -- read plus this call's moves; an HINCRBY when the call never read it).
  local function fair_flush(fk)
    fair_give_back(fk)
    local fields = {}
    if fk.jobs_delta ~= 0 and fk.jobs ~= nil then
      fk.jobs = fk.jobs + fk.jobs_delta
      fields[#fields + 1], fields[#fields + 2] = 'jobs', fk.jobs
    elseif fk.jobs_delta ~= 0 then
      redis.call('HINCRBY', fk.state, 'jobs', fk.jobs_delta)
    end
    fk.jobs_delta = 0
    if fk.clock_moved then
      fields[#fields + 1], fields[#fields + 2] = 'clock', fk.clock
      fk.clock_moved = false
    end
    if fk.entered_moved then
      fields[#fields + 1], fields[#fields + 2] = 'entered', fk.entered
      fk.entered_moved = false
    end
    if #fields > 0 then redis.call('HSET', fk.state, unpack(fields)) end
  end

  -- Whether a fair queue has a job a turn could give now.
  local function fair_waiting(fk)
    return redis.call('EXISTS', fk.turns) == 1
  end

  fair_functions = {keys = fair_keys, tenant_of = fair_tenant_of, jobs = fair_jobs,
                    enter = fair_enter, release = fair_release, sort = fair_sort,
                    pop = fair_pop, run_rest = fair_run_rest, hold = fair_hold,
                    flush = fair_flush,
                    waiting = fair_waiting}
  return fair_functions
end

-- A queue's fairness as stored in the fair queues' settings hash ("fair", "fair/<tenant
-- limit>"; anything else: a plain queue): its keys (from the key template, %s for the
-- queue name), or false.
local function fair_setting(settings_key, template, name)
  local setting = redis.call('HGET', settings_key, name)
  local tenant_limit = setting and string.match(setting, '^fair/(%d+)$')
  if setting == 'fair' or tenant_limit then
    return fair_library().keys(string.format(template, name), tonumber(tenant_limit))
  end
  return false
end

