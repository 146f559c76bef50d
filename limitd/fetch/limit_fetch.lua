-- limit_fetch: settle the jobs this capsule finished (any number, maybe none), then take
-- up to ``want`` jobs, each from the first eligible queue, in one call.
--
-- KEYS[1]  limitd:limits          hash  queue -> global limit (absent/non-number: none)
-- KEYS[2]  limitd:process_limits  hash  queue -> per-capsule limit
-- KEYS[3]  limitd:paused          set   paused queue names
-- KEYS[4]  limitd:busy            hash  queue -> jobs in progress in every capsule
-- KEYS[5]  limitd:capsule:<id>:queues  set of queues this capsule holds jobs from
-- KEYS[6]  limitd:capsules        set   capsule ids that may hold jobs
-- KEYS[7]  limitd:rate_limits     hash  queue -> rate limit "count/seconds" (else none)
-- KEYS[6 + 2k], KEYS[7 + 2k]  for the k-th queue with jobs to settle (k = 1..u): its
--          in-progress list and its queue list
-- KEYS[5 + 2u + 3i], KEYS[6 + 2u + 3i], KEYS[7 + 2u + 3i]  for the i-th queue to fetch
--          from (i = 1..n): queue:<name>, limitd:capsule:<id>:inprogress:<name> and
--          limitd:rate:<name> (its rate schedule; only read when it has a rate limit)
-- ARGV[1]  this capsule's id
-- ARGV[2]  the wake-up channel (limitd:wake)
-- ARGV[3]  "ack" (done with the settled jobs), "requeue" (push them back to the front)
--          or "yield" (push them back to the end: an iterable job giving way to the
--          jobs queued after it)
-- ARGV[4]  u, the number of queues with jobs to settle
-- ARGV[5]  want, the most jobs to take
-- ARGV[6]  n, the number of queues
-- ARGV[7]  the time in microseconds for rate limits, or "" for Redis's own clock (TIME);
--          only tests pass one
-- ARGV[6 + 2k], ARGV[7 + 2k]  the k-th queue with jobs to settle: its name, and how many
--          of its jobs are settled
-- ARGV[7 + 2u + j]  the j-th job to settle, exactly as fetched (j = 1..s, s the sum of
--          those counts): the first queue's jobs, then the second's... (a queue's keys
--          and name once, not once per job: a call settles several jobs of a queue)
-- ARGV[7 + 2u + s + i]  the i-th queue's name
-- ARGV[8 + 2u + s + n]  the blocking queues among them, by number ("2,5"), or "" (most
--          calls: one argument, not one per queue)
-- KEYS[#KEYS - 3], KEYS[#KEYS - 2]  with the ready index only (ARGV[F + 1] not ""):
--          limitd:capsule:<id>:ready (zset queue -> rank: the queues this capsule's
--          fetch looks at) and limitd:capsule:<id>:rate_wait (zset "<rank>:<queue>" ->
--          when its rate allows a job); see limitd/fetch/ready_index.py
-- KEYS[#KEYS - 1]  limitd:fair_queues  hash queue -> "fair", "fair/<tenant limit>" or
--          "off": a fair queue's arrivals are sorted into one line per tenant and
--          taken by turns (fair_lib.lua, prepended); its keys are built from the
--          template ARGV[F] and the queue name, its lines' from the tenant's name,
--          which only the script knows (they share the queue's hash tag in a cluster)
-- KEYS[#KEYS]  limitd:recoveries  hash of suspects (see limitd/fetch/recoveries.py):
--          sha1(job) -> crashes charged, sha1(job):alone -> of those, crashes while it
--          ran as its process's only suspect, held:<capsule id> -> the suspect this
--          capsule holds, running:<capsule id> -> the same once it started
-- ARGV[F], F = 9 + 2u + s + n  the fair queues' key template (limitd.keys.fair_template)
-- ARGV[F + 1]  "" (no ready index: the queues given are all there is) or the index's
--          order, "strict" or "sample"; then h, the number of hints
-- with the index: ARGV[F + 3] "1" if the queues given are every queue the index holds
--          (the caller mirrors it), ARGV[F + 4] "0" rate_wait is empty, "1" it is not,
--          "2" and its first queue may be due, ARGV[F + 5] how many queues to return
--          when the reply reads the index afresh, ARGV[F + 6] how many queues the
--          caller knows the index holds beyond those given (it is read afresh only
--          when more than those leave), then h pairs (queue, rank): queues named by
--          wake-ups, added to the index first
-- ARGV[O + m], O = F + 2 + 2h (F + 6 + 2h with the index)  optional: the order in
--          which the m-th job tries the queues, as queue numbers ("2,1,3"; weighted and
--          random orders differ per job); a job without one tries them in the order
--          given (with a strict index: the queues in the index's order)
--
-- Returns {settled, room in, index part, name 1, job 1, crashes 1, alone 1, name 2, ...}:
-- the index part is {} without the index, else {stale, refilled, rate in, queues...}
-- (see index_reply below); settled counts the settled jobs that were in this capsule's in-progress lists (a job
-- that was not, was reaped and requeued already); room in is 0, or the milliseconds
-- until the first queue that had jobs waiting only for its rate limit may be fetched
-- again (the idle capsule sleeps that long rather than poll); then the jobs taken,
-- oldest first, each with the crashes charged to it and how many of those it was alone
-- in (so the caller can bury a poison job instead of running it again).
--
-- Suspects: a job with crashes charged is a suspect, and a capsule holds at most one
-- suspect at a time, so that a crash while it runs can be charged to it and not to its
-- neighbours. A suspect met while this capsule holds one already goes to the back of
-- its queue (another capsule, or this one later, takes it) and the fetch goes on past
-- it: suspects never hold up the rest of the work. At most MAX_DEFERRED are passed over
-- in one call. Settling the held suspect (acknowledged or requeued) releases the hold.
--
-- Rate limits: with rate "N/T", any window of T seconds holds at most N fetches of the
-- queue, wherever the window starts. A GCRA (one number per queue: its theoretical
-- arrival time; O(1), the key expires once it has passed) with a burst of B = max(1,
-- floor(N / 100)) jobs and one job every T / (N - B + 1) after it: a burst costs as much
-- sustained rate as it lends, which is what keeps every window at N (B jobs at t, then
-- N - B more no sooner than T / (N - B + 1) apart: the (N + 1)-th comes at t + T). Below
-- 200 per interval that is one job every T / N, no burst at all; above, at most 1% of N
-- start together and the sustained rate is at least 99% of N / T. The burst matters to
-- fast rates: a call reads the clock once, so without it a queue could give only one
-- job per call, whatever its rate. Idle time is not saved up beyond the burst, so a
-- job taken late does not let the next ones catch up. A queue that has used its rate is
-- skipped like one at its limit (a blocking one stops the fetch). The clock is Redis's
-- TIME, not the capsules': capsules on several hosts share one schedule, and skew
-- between their clocks must not let two of them see room for the same slot. (Redis
-- replicates scripts by their effects, so reading the time before writing is allowed.)
--
-- Why atomic: the limit check, the pop and the slot count must not interleave with
-- other fetchers, or two of them could both see "2 of 3 busy" and take the third slot.
-- Settling removes the in-progress entry and frees the slot together, which keeps the
-- busy count equal to the number of in-progress entries. The entry is the proof of
-- ownership: a capsule that was reaped (its jobs requeued, its slots freed by another
-- process) finds nothing to remove, so its late ack frees no slot it no longer holds.
-- Settling in the same call as the next fetch halves the round trips per job, and a
-- capsule's dispatcher settles and takes several jobs per call under load.
--
-- Cost: what the call needs of a queue's state is read once per call, not once per job
-- (LLEN, SISMEMBER, the limits and the busy count), then counted here as jobs are
-- settled and taken: nothing else can change those keys while the script runs, so the
-- counts stay exact. The jobs a queue gives in one call move with one RPOP (with a
-- count) and one LPUSH; a queue's limit and busy count are read (one HGET each) when
-- the call first needs them, the busy counts changed are written with one HSET, and the
-- queues the call takes out of the ready index leave it in one ZREM. (Reading the
-- counts of the next few queues in one HMGET cost more: inside a script a command is
-- cheap next to the Lua that builds its fields and converts its reply, and a read
-- ahead reads queues the call then finds empty or never reaches.) Only settling
-- scans anything: this capsule's own in-progress list (LREM from its oldest end),
-- whose length is bounded by the capsule's threads. The keys most deployments never
-- create (paused queues, process limits, fair queues, rate limits, suspects) cost one
-- EXISTS per call together while none exists. Rate limits add one HGET per queue per
-- call, and a TIME, a GET and a SET per call for a rate-limited queue, whatever the
-- jobs it gives. While the recoveries hash exists, each job is popped on its own and
-- looked up (a SHA-1 and an HMGET). Lua's own work counts too. Called by EVALSHA
-- (Redis 6, a cluster), each call runs this whole file, and making a local function
-- costs about a quarter of a redis.call; as a Redis 7 function (FCALL: see the entry,
-- ``limit_fetch``, at the end) the file runs once, when its library loads, and a call
-- makes only the tables it keeps. Either way the functions of what most calls never
-- meet are made by the first call that does: fair_lib.lua's once a queue is found fair
-- (``fair_library()``; they keep nothing of a call, so a library makes them once), the
-- rate limits' once a queue is looked at while some exist (``rate_library()``), the
-- suspects' once a job is settled or taken while some exist (``suspect_library()``);
-- those two keep the call's state, so each call makes its own. What things cost, in
-- instructions Redis 7.0 runs (bench/fetch_call.py --callgrind and the like): a
-- redis.call 5,000 to 7,000 with the command, each argument of the call 1,200, a number
-- where a string would do 2,300 more, a tonumber 1,500, a table of a dozen fields
-- 5,000, a Lua function call 400. Hence the small counts passed as strings
-- (COUNT_TEXT), the rare keys' test before each call of ``exists``, and, in the shared
-- order, a plain queue giving the rest of a call's share of it in one step
-- (``room_beside``) rather than one walk of the order per job.
-- (KEYS and ARGV as locals, set by the entry: a global is a table lookup at each use,
-- and a call over many queues reads them dozens of times.)
-- This call's keys and its first arguments: set by ``limit_fetch`` (the entry, at the
-- end), like everything else this call keeps, so that the functions are made once
-- where Redis runs this file as a library (see the end) and not at every call.
local KEYS, ARGV
local limits, process_limits, paused, busy, held, capsules, capsule_id, channel
local rate_limits, fair_settings, recoveries
local fair_at -- ARGV[fair_at]: the fair queues' key template (set once the counts are read)
-- What else a call keeps, set afresh by ``begin_call`` below (each is described where
-- it is used). Declared here, before the functions that use them, so that making
-- ``begin_call`` looks its upvalues up in a short list: Lua finds each upvalue of a new
-- function by walking the enclosing function's open upvalues, newest first, and with
-- EVALSHA that walk is made again for every function at every call.
local RARE_KEYS, exists_once, rare_unknown, rare_unfound, none_rare
local limit_of, busy_of, busy_changed, fair_of_name, deferred, suspect_functions
local now, rate_functions, room_at, state, looked, spent, picks, jobs_of, job_charges
-- (the call's counts and where its parts start in ARGV, read by ``read_call``)
local settled_queues, want, queues, names_at, blocks
local spec_at, index_mode, hints, ready, rate_wait
local complete, refill_size, spare, unlisted, grew, rate_touched
local natural, orders_at

local function begin_call(keys, args)
  KEYS, ARGV = keys, args
  limits, process_limits, paused, busy = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  held, capsules, capsule_id, channel = KEYS[5], KEYS[6], ARGV[1], ARGV[2]
  rate_limits, fair_settings, recoveries = KEYS[7], KEYS[#KEYS - 1], KEYS[#KEYS]
  RARE_KEYS = {paused, process_limits, fair_settings, rate_limits, recoveries}
  exists_once, rare_unknown, rare_unfound, none_rare = nil, #RARE_KEYS, 0, false
  limit_of, busy_of, busy_changed, fair_of_name = {}, {}, {}, {}
  deferred, suspect_functions, now, rate_functions = 0, nil, nil, nil
  room_at, state, looked, spent = nil, {}, {}, 0
  picks, jobs_of, job_charges = {}, {}, {}
end

local MAX_SORTED = 1000 -- a fair queue's arrivals sorted into lines per call, at most

-- Whether a key that most deployments leave absent exists (the paused queues, the
-- process limits, the fair queues, the rate limits, the recovered suspects), asked at
-- most once a call, and all five in one EXISTS first: while none does, no queue is
-- paused, limited per process, fair or rate-limited, no job is a suspect, and none is
-- asked about it. An idle poll asks it once. When some exist, the count says how many
-- are still to be found, so a deployment that uses one of them (fair queues, say) asks
-- only until it has found that one, not all five. Once the first EXISTS found none,
-- ``none_rare`` says so, and the places met per queue and per job test it before they
-- call ``exists`` (a Lua function call costs as much as the test it would make).
-- Once some exist, the fair queues' settings are asked first: every call that looks at
-- a queue asks them, and where they are the one rare key (fair queues, nothing paused,
-- no suspects) finding them tells the rest.
local function exists(key)
  if none_rare then return false end
  if exists_once == nil then
    exists_once = {}
    rare_unfound = redis.call('EXISTS', unpack(RARE_KEYS))
    if rare_unfound == 0 then
      none_rare = true
      return false
    end
    if key ~= fair_settings then exists(fair_settings) end
  end
  if exists_once[key] == nil then
    if rare_unfound == 0 or rare_unfound == rare_unknown then
      exists_once[key] = rare_unfound > 0 -- none left to find, or every one left exists
    else
      exists_once[key] = redis.call('EXISTS', key) == 1
    end
    rare_unknown = rare_unknown - 1
    if exists_once[key] then rare_unfound = rare_unfound - 1 end
  end
  return exists_once[key]
end

-- Whether any job has crashes charged: asked only by a call that settles or takes a job.
local function any_recovered()
  return exists(recoveries)
end

-- A queue's global limit and busy count, by name (``limit_of``, ``busy_of``): read on
-- first use in this call, then kept current here. The busy counts this call changed
-- (``busy_changed``) are written once, at the end: one HSET, not an HINCRBY per queue
-- settled and per queue taken from.

-- Small counts as strings, for the counts this call passes to Redis (each queue's RPOP
-- count, each busy count it writes): a Lua number argument is formatted with
-- snprintf("%.17g"), which costs half as much again as the argument itself, and a call
-- over many shallow queues passes several per job. COUNT_TEXT[n + 1] is n, for n < 16
-- (a longer table costs more to build each call than it saves, with EVALSHA).
local COUNT_TEXT = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '11', '12',
                    '13', '14', '15'}

local function limit(name)
  if limit_of[name] == nil then
    limit_of[name] = tonumber(redis.call('HGET', limits, name)) or false
  end
  return limit_of[name]
end

local function busy_count(name)
  if busy_of[name] == nil then
    busy_of[name] = tonumber(redis.call('HGET', busy, name) or '0')
  end
  return busy_of[name]
end

local function set_busy(name, count)
  busy_of[name] = count
  busy_changed[name] = true
end

local function add_busy(name, count)
  set_busy(name, busy_count(name) + count)
end

-- Suspects (see the header). Only looked at while the recoveries hash exists, by a
-- call that settles or takes a job: their functions are made then, by
-- ``suspect_library()`` (once a call), not by every call.
local MAX_DEFERRED = 200

local function suspect_library()
  if suspect_functions then return suspect_functions end
  local held_field, running_field = 'held:' .. capsule_id, 'running:' .. capsule_id
  -- The sha1 of the suspect this capsule holds, or false; read once.
  local held_suspect = nil

  local function holds_suspect()
    if held_suspect == nil then
      held_suspect = redis.call('HGET', recoveries, held_field) or false
    end
    return held_suspect
  end

  -- A settled job that was this capsule's suspect frees the capsule for another one.
  local function release_suspect(job)
    if not any_recovered() or not holds_suspect() then return end
    if held_suspect == redis.sha1hex(job) then
      redis.call('HDEL', recoveries, held_field, running_field)
      held_suspect = false
    end
  end

  -- The crashes charged to a job, and how many of them it was alone in (0, 0 for most).
  local function charges(job)
    if not any_recovered() then return 0, 0, nil end
    local id = redis.sha1hex(job)
    local found = redis.call('HMGET', recoveries, id, id .. ':alone')
    return tonumber(found[1]) or 0, tonumber(found[2]) or 0, id
  end

  -- While suspects may exist, each job is popped as it is picked, so that a suspect
  -- this capsule may not hold goes to the back of its queue instead (its pick undone:
  -- the slot, the rate and the count are as if it had never been looked at, except that
  -- it is not looked at again in this call). Returns the job kept, or nil.
  local function check_suspect(st, job, job_charges)
    local crashes, alone, id = charges(job)
    if crashes > 0 and holds_suspect() then
      redis.call('LPUSH', st.queue_key, job)
      st.taken, st.held, st.deferred = st.taken - 1, st.held - 1, true
      add_busy(st.name, -1)
      deferred = deferred + 1
      return nil
    end
    if crashes > 0 then
      redis.call('HSET', recoveries, held_field, id)
      held_suspect = id
    end
    job_charges[job] = {crashes, alone}
    return job
  end

  local function pop_checked(st, job_charges)
    return check_suspect(st, redis.call('RPOP', st.queue_key), job_charges)
  end

  suspect_functions = {release = release_suspect, check = check_suspect,
                       pop_checked = pop_checked}
  return suspect_functions
end

-- A fair queue's keys and tenant limit (see fair_lib.lua), by queue name; false for a
-- queue that is not fair. limitd:fair_queues holds "fair", "fair/<tenant limit>" or
-- "off" (made plain at run time) per queue.
local function fair_of(name)
  if fair_of_name[name] == nil then
    fair_of_name[name] = exists(fair_settings)
      and fair_setting(fair_settings, ARGV[fair_at], name) or false
  end
  return fair_of_name[name]
end

-- Free ``count`` slots of queue ``name``, whose jobs were settled; returns how many
-- are left busy.
local function release(name, count)
  local left = math.max(0, busy_count(name) - count)
  set_busy(name, left)
  return left
end

-- Free the slots of acknowledged jobs, and say so if they were the last of a queue at
-- its limit with jobs waiting for them (another capsule may be idle for want of one).
local function free_slots(name, queue_key, count)
  local left, cap = release(name, count), limit(name)
  if cap and left < cap and left + count >= cap then
    local fair = not none_rare and fair_of(name) -- its jobs wait in its tenants' lines too
    if redis.call('LLEN', queue_key) > 0 or (fair and fair_library().waiting(fair)) then
      redis.call('PUBLISH', channel, name)
    end
  end
end

-- Remove one finished job from its in-progress list: 1 if it was there. A requeued job
-- goes back to the front of its queue now (a yielded one to the end); an acknowledged
-- one's slot is freed by the caller, with the others of its queue.
local function settle(in_progress_key, queue_key, job, name, mode)
  -- From the tail, where the oldest jobs are (each call pushes to the head), which
  -- finish first most of the time: the scan stops at the first match. (The count as a
  -- string: Redis formats a Lua number argument with snprintf("%.17g"), which costs
  -- about as much as half a command.)
  if redis.call('LREM', in_progress_key, '-1', job) == 0 then
    return 0
  end
  if not none_rare and any_recovered() then suspect_library().release(job) end
  local fair = not none_rare and fair_of(name)
  if fair and mode == 'ack' and not fair.limit then
    return 1 -- nothing is kept per running job without a tenant limit (fair_lib.lua)
  elseif fair then
    local lib = fair_library()
    local was, turned = lib.release(fair, job)
    if mode ~= 'ack' then -- back into its tenant's line, not the arrivals
      release(name, 1)
      lib.enter(fair, was or lib.tenant_of(job), {job}, mode ~= 'yield')
    end
    if turned or mode ~= 'ack' then redis.call('PUBLISH', channel, name) end
    return 1
  end
  if mode ~= 'ack' then
    release(name, 1)
    redis.call(mode == 'yield' and 'LPUSH' or 'RPUSH', queue_key, job)
    redis.call('PUBLISH', channel, name)
  end
  return 1
end

-- Rate limits. The hash is looked at once per call, each queue's rate once per call.
-- Their functions are made only by a call that meets a queue while the hash exists
-- (``rate_library()``, once a call); ``clock`` is apart: the ready index reads it too.

local function clock()
  if now == nil then
    if ARGV[7] ~= '' then
      now = tonumber(ARGV[7])
    else
      local time = redis.call('TIME')
      now = tonumber(time[1]) * 1000000 + tonumber(time[2])
    end
  end
  return now
end

local function rate_library()
  if rate_functions then return rate_functions end
  local rates = {}

  -- A queue's rate as the GCRA uses it (microseconds), or false when it has none.
  local function rate_of(name)
    if not exists(rate_limits) then return false end
    if rates[name] == nil then
      local count, seconds = string.match(
        redis.call('HGET', rate_limits, name) or '', '^(%d+)/([%d.]+)$')
      count, seconds = tonumber(count), tonumber(seconds)
      if count and seconds and count >= 1 and seconds > 0 then
        local burst = math.max(1, math.floor(count / 100))
        local interval = seconds * 1000000 / (count - burst + 1)
        rates[name] = {interval = interval, tolerance = (burst - 1) * interval}
      else
        rates[name] = false
      end
    end
    return rates[name]
  end

  -- Arrival times read and moved in this call, by rate key; written back once, at the
  -- end.
  local arrivals, moved = {}, {}

  -- The queue's theoretical arrival time: its next job may be taken once the clock has
  -- reached it minus the tolerance. A value further ahead than a take now could have
  -- left was set under a slower rate: it is pulled back (and stored so).
  local function arrival(rate_key, rate)
    if arrivals[rate_key] == nil then
      local tat = tonumber(redis.call('GET', rate_key)) or 0
      local ceiling = math.ceil(clock() + rate.tolerance + rate.interval)
      if tat > ceiling then
        tat = ceiling
        moved[#moved + 1] = rate_key
      end
      arrivals[rate_key] = tat
    end
    return arrivals[rate_key]
  end

  local function use_rate(rate_key, rate, tat)
    -- Rounded up: a schedule rounded down would let N + 1 jobs into some window.
    arrivals[rate_key] = math.ceil(math.max(tat, clock()) + rate.interval)
    moved[#moved + 1] = rate_key
  end

  local function save_arrivals()
    for _, rate_key in ipairs(moved) do
      local at = arrivals[rate_key]
      if at then
        -- Kept a second past its arrival time: once passed it reads as absent anyway,
        -- and the grace covers a caller whose clock runs a little behind Redis's.
        redis.call('SET', rate_key, string.format('%d', at),
          'PX', math.ceil((at - clock()) / 1000) + 1000)
        arrivals[rate_key] = false -- written: once is enough
      end
    end
  end

  rate_functions = {of = rate_of, arrival = arrival, use = use_rate,
                    save = save_arrivals}
  return rate_functions
end

local function read_call()
  settled_queues, want, queues = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local settles = 0 -- the jobs to settle
  for k = 1, settled_queues do settles = settles + tonumber(ARGV[7 + 2 * k]) end
  names_at = 2 * settled_queues + settles -- ARGV[7 + names_at + i]: queue i's name
  fair_at = 9 + names_at + queues
  blocks = nil -- queue number -> true, for the blocking queues given
  if ARGV[fair_at - 1] ~= '' then
    blocks = {}
    for number in string.gmatch(ARGV[fair_at - 1], '%d+') do blocks[tonumber(number)] = true end
  end

  -- The ready index (this capsule's; see the header). The caller mirrors it: it passes
  -- the queues it knows the index holds (and hints: queues to add), says whether those
  -- are all of them (``complete``), and learns from the reply what this call took out,
  -- or, when it cannot follow (the index grew here, or it knew only its first queues
  -- and some left), the index's first queues afresh. So a call whose index the caller
  -- knows in full reads nothing of it.
  spec_at = fair_at + 1 -- ARGV[spec_at]: "", "strict" or "sample"
  index_mode = ARGV[spec_at] ~= '' and ARGV[spec_at] or nil
  hints = tonumber(ARGV[spec_at + 1]) or 0
  ready, rate_wait = nil, nil
  complete, refill_size, spare = false, 0, 0
  unlisted, grew, rate_touched = {}, false, false
  natural = {}
  for i = 1, queues do natural[i] = i end
  orders_at = spec_at + (index_mode and 5 or 1) + 2 * hints -- ARGV[orders_at + m]
  if index_mode then
    ready, rate_wait = KEYS[#KEYS - 3], KEYS[#KEYS - 2]
    complete = ARGV[spec_at + 2] == '1'
    refill_size, spare = tonumber(ARGV[spec_at + 4]), tonumber(ARGV[spec_at + 5])
    for first = 1, hints, 1000 do
      local ranked = {}
      for k = first, math.min(first + 999, hints) do
        ranked[#ranked + 1] = ARGV[spec_at + 5 + 2 * k]
        ranked[#ranked + 1] = ARGV[spec_at + 4 + 2 * k]
      end
      redis.call('ZADD', ready, unpack(ranked))
    end
    -- ARGV[spec_at + 3]: "0" rate_wait is empty, "1" it is not, "2" and the caller's
    -- clock says its first queue may be due.
    if ARGV[spec_at + 3] == '2' then
      rate_touched = true
      local due = redis.call('ZRANGEBYSCORE', rate_wait, '-inf', clock(), 'LIMIT', 0, 1000)
      if #due > 0 then
        local ranked = {}
        for _, member in ipairs(due) do
          local rank, name = string.match(member, '^([^:]+):(.*)$')
          ranked[#ranked + 1] = rank
          ranked[#ranked + 1] = name
        end
        redis.call('ZADD', ready, unpack(ranked))
        redis.call('ZREM', rate_wait, unpack(due))
        grew = true
      end
    end
  end
end

-- Take a queue out of the index while no capsule may take from it: empty or paused
-- (a push or a resume publishes, and the wake-up hints it back), full (the ack that
-- frees a slot publishes) or waiting for its rate (kept in ``rate_wait`` until
-- ``free_at``, microseconds, then put back by a call of this capsule). They leave the
-- index together, in one ZREM at the end of the call (``remove_unlisted``): a call
-- over many queues of a job or two each empties several.
local function unlist_name(name)
  unlisted[#unlisted + 1] = name
end

local function remove_unlisted()
  for first = 1, #unlisted, 1000 do
    redis.call('ZREM', ready, unpack(unlisted, first, math.min(first + 999, #unlisted)))
  end
end

local function unlist(st)
  if ready and not st.unlisted then
    st.unlisted = true
    unlist_name(st.name)
  end
end

local function set_aside(st, free_at)
  if not ready or st.unlisted then return end
  local rank = free_at and redis.call('ZSCORE', ready, st.name)
  if rank then
    redis.call('ZADD', rate_wait, math.ceil(free_at), rank .. ':' .. st.name)
    rate_touched = true
  end
  unlist(st)
end

local function order_of(m)
  local given = ARGV[orders_at + m]
  if not given then return natural end
  local order = {}
  for number in string.gmatch(given, '%d+') do order[#order + 1] = tonumber(number) end
  return order
end

-- ``room_at``: the earliest time (microseconds) a queue skipped for its rate limit may
-- be fetched.

-- Whether queue ``st`` may give a job now; with a rate limit, also its rate and
-- arrival time (to move on when a job is taken). Its rate is looked up once a call.
local function rate_allows(st)
  local rate = st.rate
  if rate == nil then
    rate = not none_rare and exists(rate_limits) and rate_library().of(st.name)
    st.rate = rate
  end
  if not rate then return true end
  local tat = rate_library().arrival(st.rate_key, rate)
  local free_at = tat - rate.tolerance
  if free_at <= clock() then return true, rate, tat end
  room_at = math.min(room_at or free_at, free_at)
  return false, nil, nil, free_at
end

-- Queue i's state in this call: its keys, the jobs left in it, whether it may give any
-- at all (not empty, not paused), its process limit and this capsule's jobs of it in
-- progress (read when first needed), and the jobs taken from it so far (``state``, by
-- queue number; ``looked``: the states that are not EMPTY, in the order met).
local EMPTY = {open = false, left = 0, taken = 0} -- shared by every empty queue

local function queue_state(i)
  local st = state[i]
  if st == nil then
    local at = 2 * settled_queues + 3 * i -- queue i's keys: 5 + at, 6 + at, 7 + at
    -- An empty queue is skipped before anything else is read: an idle poll costs one
    -- LLEN (and one SISMEMBER) per queue, and a call over many queues builds nothing
    -- for the empty ones.
    local left = redis.call('LLEN', KEYS[5 + at])
    local name = ARGV[7 + names_at + i]
    -- (A fair queue may have jobs in its tenants' lines with none among its arrivals.)
    local fair = not none_rare and exists(fair_settings) and fair_of(name)
    local unsorted = 0
    if fair then -- its arrivals into their tenants' lines; what it has is what turns give
      local lib = fair_library()
      lib.sort(fair, KEYS[5 + at], math.min(left, MAX_SORTED))
      unsorted = left - math.min(left, MAX_SORTED)
      -- Without a tenant limit every tenant with a line has a turn, so the count of
      -- the jobs in the lines says whether one waits; with one, or when the count says
      -- none (or less: a count gone wrong must not hide a line), the turns are asked
      -- (a pick that finds no turn is undone anyway).
      local jobs = lib.jobs(fair)
      if fair.limit or jobs <= 0 then
        left = lib.waiting(fair) and math.max(1, jobs) or 0
      else
        left = jobs
      end
    end
    if left == 0 and unsorted == 0 then
      if ready then unlist_name(name) end
      state[i] = EMPTY
      return EMPTY
    end
    st = {name = name, blocking = blocks ~= nil and blocks[i] == true,
          queue_key = KEYS[5 + at], in_progress_key = KEYS[6 + at], rate_key = KEYS[7 + at],
          left = left, taken = 0, fair = fair, unsorted = unsorted}
    st.open = none_rare or not exists(paused) or redis.call('SISMEMBER', paused, name) == 0
    if not st.open then unlist(st) end
    state[i] = st
    looked[#looked + 1] = st
  end
  return st
end

local function at_limit(st)
  if st.held == nil then
    st.process_limit = not none_rare and exists(process_limits)
      and tonumber(redis.call('HGET', process_limits, st.name)) or false
    st.held = st.process_limit and redis.call('LLEN', st.in_progress_key) or 0
  end
  if st.process_limit and st.held >= st.process_limit then
    return 'process'
  end
  local cap = limit(st.name)
  return cap and busy_count(st.name) >= cap and 'global'
end

-- Pick the queue the next job comes from: the first eligible one of ``order``. Returns
-- its state (and its rate and arrival time, to move on once the job is kept), "stop"
-- when a blocking queue holds the rest back, or nil when no queue has a job to give.
-- The job itself moves later, with the others taken from that queue.
--
-- Jobs that share an order (every job, in the given order) start past the queues that
-- have nothing left for this call (``spent``): none comes back within a call, and over
-- many shallow queues each job would otherwise walk past every one the call emptied.
local function take_one(order)
  local shared = order == natural
  for at = shared and spent + 1 or 1, #order do
    local st = queue_state(order[at])
    if shared and at == spent + 1 and not (st.open and st.left > 0) then spent = at end
    if st.open and st.left > 0 then
      local held_by, rate, tat, free_at = at_limit(st), nil, nil, nil
      local free = not held_by
      if free then free, rate, tat, free_at = rate_allows(st) end
      if free then
        st.left, st.taken, st.held = st.left - 1, st.taken + 1, st.held + 1
        add_busy(st.name, 1)
        return st, rate, tat
      elseif st.blocking then
        -- A blocking queue with work waiting for a slot: lower queues must not jump ahead.
        return 'stop'
      elseif held_by ~= 'process' then
        -- No capsule may take from it now (its limit, or its rate until ``rate``).
        set_aside(st, free_at)
      end
    end
  end
  return nil
end

-- A fair queue's job is popped as it is picked, by turns (fair_lib.lua); a pick that
-- finds no tenant with a turn is undone, and the queue gives nothing more this call.
-- ``most``: the jobs this call may still take (a tenant alone gives them in one RPOP).
local function pop_fair(st, job_charges, most)
  local job, tenant = fair_library().pop(st.fair, most)
  if job == nil then
    st.left, st.taken, st.held = 0, st.taken - 1, st.held - 1
    add_busy(st.name, -1)
    return nil
  end
  if any_recovered() then
    job = suspect_library().check(st, job, job_charges)
    if job == nil then return nil end -- back among the arrivals, sorted again later
  end
  fair_library().hold(st.fair, job, tenant)
  return job
end

-- Settle first, so the slots freed are free for the jobs taken next: each queue's jobs,
-- then its slots (of the jobs that were still this capsule's) at once.

local function settle_all()
  local settled, mode, job_at = 0, ARGV[3], 7 + 2 * settled_queues -- ARGV[job_at + 1]: next
  for k = 1, settled_queues do
    local name, in_progress_key, queue_key = ARGV[6 + 2 * k], KEYS[6 + 2 * k], KEYS[7 + 2 * k]
    local count, acked = tonumber(ARGV[7 + 2 * k]), 0
    for j = job_at + 1, job_at + count do
      local done = settle(in_progress_key, queue_key, ARGV[j], name, mode)
      settled = settled + done
      if mode == 'ack' then acked = acked + done end
    end
    job_at = job_at + count
    if acked > 0 then free_slots(name, queue_key, acked) end
  end
  return settled
end

-- Each job starts again from the first queue of its order, so a strict order stays
-- strict, weights apply per job, and every job sees the busy counts the previous one
-- updated (and the rate schedules it moved).
-- The jobs a plain queue (not fair, no rate limit, no suspects) can still give while it
-- has jobs and room, beside the one just picked from it: in the shared order, each of
-- the next jobs would be picked from it again (the queues before it gave way, and
-- nothing that made them give way changes within a call).
local function room_beside(st)
  local room = st.left
  if st.process_limit then room = math.min(room, st.process_limit - st.held) end
  local cap = limit(st.name)
  if cap then room = math.min(room, cap - busy_count(st.name)) end
  return room
end

local function take_all()
  while #picks < want and deferred < MAX_DEFERRED do
    local order = order_of(#picks + 1)
    local st, rate, tat = take_one(order)
    if st == nil or st == 'stop' then break end
    local kept = true
    local plain = not st.fair and (none_rare or not any_recovered())
    if not plain then
      local job
      if st.fair then
        job = pop_fair(st, job_charges, want - #picks)
      else
        job = suspect_library().pop_checked(st, job_charges)
      end
      kept = job ~= nil
      if kept then
        jobs_of[st] = jobs_of[st] or {}
        jobs_of[st][#jobs_of[st] + 1] = job
      end
    end
    if kept then
      if rate then rate_library().use(st.rate_key, rate, tat) end
      picks[#picks + 1] = st
    end
    if plain and not rate and order == natural then -- the rest of its share at once
      local more = math.min(room_beside(st), want - #picks)
      if more > 0 then
        st.left, st.taken, st.held = st.left - more, st.taken + more, st.held + more
        add_busy(st.name, more)
        for _ = 1, more do picks[#picks + 1] = st end
      end
    elseif kept and st.fair and not rate and order == natural and not any_recovered() then
      -- A fair queue whose head tenant's next turns all come first (a tenant alone, say)
      -- popped them together: the rest of them at once, as for a plain queue.
      local more = math.min(room_beside(st), want - #picks)
      local jobs, from, to = nil, 0, -1
      if more > 0 then jobs, from, to = fair_library().run_rest(st.fair, more) end
      if jobs then
        local n, mine = to - from + 1, jobs_of[st]
        st.left, st.taken, st.held = st.left - n, st.taken + n, st.held + n
        add_busy(st.name, n)
        for k = from, to do
          mine[#mine + 1] = jobs[k]
          picks[#picks + 1] = st
        end
      end
    end
  end
end

-- The end of a call: the jobs taken move, the busy counts and the fair queues' counters
-- are written, and the reply is made (``settled``: the jobs settled first).
local function finish(settled)
  -- Move each queue's jobs in one go: the oldest (right end) first, each to the left of
  -- the in-progress list, as one LMOVE per job would. (Popped one by one above while
  -- suspects may exist.)
  local holding = {}
  for _, st in ipairs(looked) do
    if st.taken > 0 then
      jobs_of[st] = jobs_of[st]
        or redis.call('RPOP', st.queue_key, COUNT_TEXT[st.taken + 1] or st.taken)
      redis.call('LPUSH', st.in_progress_key, unpack(jobs_of[st]))
      holding[#holding + 1] = st.name
    end
  end
  if #holding > 0 then
    redis.call('SADD', held, unpack(holding))
    redis.call('SADD', capsules, capsule_id)
  end
  -- Write the busy counts this call changed (see ``limit_of`` above), in one HSET (a
  -- thousand at a time).
  do
    local pairs_ = {}
    for name in pairs(busy_changed) do
      pairs_[#pairs_ + 1] = name
      pairs_[#pairs_ + 1] = COUNT_TEXT[busy_of[name] + 1] or busy_of[name]
    end
    for first = 1, #pairs_, 1000 do
      redis.call('HSET', busy, unpack(pairs_, first, math.min(first + 999, #pairs_)))
    end
  end

  for _, fair in pairs(fair_of_name) do
    if fair then fair_library().flush(fair) end
  end

  -- The index's part of the reply: {stale, refilled, rate in, names...}. ``stale``: this
  -- call took fewer jobs than wanted and the index may hold queues it was not given, or
  -- got back from rate_wait (the caller asks again at once). ``refilled``: 1 when ``names`` are the index's first
  -- queues (strict) or a random few (sample), read afresh; 0 when they are the queues this
  -- call took out. ``rate in``: when rate_wait changed, the milliseconds until its first
  -- queue may give a job (-1: it is empty), else "".
  local index_part = nil
  if index_mode then
    for _, st in ipairs(looked) do
      if st.left == 0 and st.unsorted == 0 and not st.deferred then unlist(st) end
    end
    remove_unlisted()
    local short = #picks < want
    local names = unlisted
    -- While the queues the caller knows beyond those it gave outnumber those that left,
    -- it follows by removing them; when they run out, it reads a new window.
    local refilled = grew or (not complete and (#unlisted > spare or short))
    if refilled and index_mode == 'strict' then
      names = redis.call('ZRANGE', ready, '0', refill_size - 1)
    elseif refilled then
      names = redis.call('ZRANDMEMBER', ready, refill_size)
    end
    local rate_in, soonest = '', nil
    if rate_touched or (#picks == 0 and not room_at and ARGV[spec_at + 3] ~= '0') then
      soonest = redis.call('ZRANGE', rate_wait, 0, 0, 'WITHSCORES')
      if #soonest > 0 then room_at = math.min(room_at or math.huge, tonumber(soonest[2])) end
    end
    if rate_touched then
      rate_in = #soonest > 0 and math.max(0, math.ceil((tonumber(soonest[2]) - clock()) / 1000)) or -1
    end
    -- Queues back from rate_wait were not given to this call: the caller asks again.
    index_part = {(short and (grew or not complete)) and 1 or 0, refilled and 1 or 0, rate_in}
    for _, name in ipairs(names) do index_part[#index_part + 1] = name end
  end

  -- (Four fields a job: counted, not found with #, which searches the table each time.)
  local taken, filled = {settled, 0, index_part or {}}, 3
  for _, st in ipairs(picks) do
    local given = (st.given or 0) + 1 -- the queue's jobs, in the order they were popped
    st.given = given
    local job = jobs_of[st][given]
    local found = job_charges[job]
    taken[filled + 1], taken[filled + 2] = st.name, job
    taken[filled + 3], taken[filled + 4] = found and found[1] or 0, found and found[2] or 0
    filled = filled + 4
  end
  if rate_functions then rate_functions.save() end
  if room_at then
    taken[2] = math.max(1, math.ceil((room_at - clock()) / 1000))
  end
  return taken
end

-- The entry: one call's state made afresh (``begin_call``), then its arguments, its
-- settles, its takes and the rest. Where Redis has functions (7.0 and later), limitd
-- loads this file as a library and calls it with FCALL (limitd/connection/functions.py,
-- ``LuaFunction``): every function above is made once, when the library loads, not at
-- every call (that was a quarter of what Redis ran for a plain call of a few jobs);
-- with EVALSHA (Redis 6, an ACL that refuses functions) the file runs whole each call.
-- Nothing a call keeps may outlive it: each of those locals is set by ``begin_call``.
local function limit_fetch(keys, args)
  begin_call(keys, args)
  read_call()
  local settled = settle_all()
  take_all()
  return finish(settled)
end
