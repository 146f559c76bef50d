-- reap_capsule: return a dead capsule's in-progress jobs to the front of their queues and
-- free its busy slots, then forget the capsule. With blame, the crash is charged to the
-- jobs it could have been caused by (see limitd/fetch/recoveries.py):
--   * the suspect the capsule was running (it held at most one, and ran no other
--     suspect beside it): one more crash, and one more crash it was alone in. It goes
--     to the back of its queue, not the front: the likeliest culprit should not be the
--     first job the replacement process runs (a crash loop that does no work), and an
--     innocent one killed from outside should not meet the next outside kill first;
--   * every job that was not a suspect yet: it becomes one, with one crash (shared with
--     its neighbours: never enough alone to bury it, see the executor);
--   * a suspect it held but had not started: nothing.
-- Without blame (the supervisor stopped the process itself) the jobs go back unmarked.
--
-- KEYS[1]  limitd:capsule:<id>:heartbeat  (checked: a capsule that beat again is alive)
-- KEYS[2]  limitd:capsules   set of capsule ids
-- KEYS[3]  limitd:busy       hash queue -> jobs in progress
-- KEYS[4]  limitd:capsule:<id>:queues
-- KEYS[3 + 2i], KEYS[4 + 2i]  for the i-th queue: queue:<name>, and the capsule's
--          in-progress list for it
-- KEYS[#KEYS - 1]  limitd:fair_queues  hash queue -> "fair", "fair/<tenant limit>"
--          (fair_lib.lua, prepended): a fair queue's jobs go back to their tenants'
--          lines, whose keys are built from ARGV[#ARGV - 4], the fair key template
-- KEYS[#KEYS]  limitd:recoveries  hash of suspects: sha1(job) -> crashes,
--          sha1(job):alone -> crashes alone, sha1(job):error -> why, held:<id> and
--          running:<id> -> the suspect the capsule held / had started
-- ARGV[1]  the capsule id
-- ARGV[1 + i]  the i-th queue name
-- ARGV[#ARGV - 4]  the fair queues' key template (limitd.keys.fair_template)
-- ARGV[#ARGV - 3]  "1" to charge the crash (see above), "0" not to
-- ARGV[#ARGV - 2]  the reason recorded for each job charged
-- ARGV[#ARGV - 1]  how long (seconds) the recoveries hash outlives its last change
-- ARGV[#ARGV]  the wake-up channel
--
-- Returns the number of jobs requeued; -1 if the capsule is alive after all; -2 if it
-- holds jobs of a queue the caller did not pass (read its queue set again and retry).
--
-- In cluster mode (limitd.keys) the call is made once per queue with that queue's own
-- keys (KEYS[2], KEYS[3], KEYS[4] and the recoveries hash are per queue there); the
-- heartbeat is on another shard, so the caller checks it first and passes as KEYS[1] a
-- name in the queue's slot that is never written.
--
-- Why atomic: two reapers may find the same dead capsule. The first moves every job and
-- frees the slots; the second finds empty lists and changes nothing, so no job is
-- requeued twice, charged twice, and no slot freed twice. The heartbeat is checked in
-- the same call so a capsule whose beat was only late is never reaped.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return -1
end
local queues = #ARGV - 6
local recoveries, reason = KEYS[#KEYS], ARGV[#ARGV - 2]
local fair_settings, fair_template = KEYS[#KEYS - 1], ARGV[#ARGV - 4]
local blame = ARGV[#ARGV - 3] == '1'
if redis.call('SCARD', KEYS[4]) > queues then
  return -2
end
local held_field, running_field = 'held:' .. ARGV[1], 'running:' .. ARGV[1]
local suspect = redis.call('HMGET', recoveries, held_field, running_field)
local held, running = suspect[1], suspect[2]
local charged = false

-- Charges the crash to ``job`` as the header says; true if it was charged alone.
local function charge(job)
  local id = redis.sha1hex(job)
  local alone = id == running
  if alone then
    redis.call('HINCRBY', recoveries, id, 1)
    redis.call('HINCRBY', recoveries, id .. ':alone', 1)
  elseif id == held or redis.call('HEXISTS', recoveries, id) == 1 then
    return false -- a suspect that was not running: not its doing
  else
    redis.call('HSET', recoveries, id, 1)
  end
  redis.call('HSET', recoveries, id .. ':error', reason)
  charged = true
  return alone
end

local moved = 0
for i = 1, queues do
  local name = ARGV[1 + i]
  local queue_key, in_progress_key = KEYS[3 + 2 * i], KEYS[4 + 2 * i]
  local fair = fair_setting(fair_settings, fair_template, name)
  local count = 0
  -- Newest first to the right end: the oldest ends rightmost and is fetched first. A
  -- fair queue's job goes to its tenant's line the same way (fair_lib.lua), its
  -- tenant slot freed.
  while true do
    local job = redis.call('LPOP', in_progress_key)
    if not job then break end
    local back = blame and charge(job)
    if fair then
      local lib = fair_library()
      local was = lib.release(fair, job)
      lib.enter(fair, was or lib.tenant_of(job), {job}, not back)
    elseif back then
      redis.call('LPUSH', queue_key, job)
    else
      redis.call('RPUSH', queue_key, job)
    end
    count = count + 1
  end
  if fair then fair_library().flush(fair) end
  if count > 0 then
    if redis.call('HINCRBY', KEYS[3], name, -count) < 0 then
      redis.call('HSET', KEYS[3], name, 0)
    end
    redis.call('PUBLISH', ARGV[#ARGV], name)
    moved = moved + count
  end
end
if held or running then
  redis.call('HDEL', recoveries, held_field, running_field)
end
if charged then
  redis.call('EXPIRE', recoveries, ARGV[#ARGV - 1])
end
redis.call('DEL', KEYS[4])
redis.call('SREM', KEYS[2], ARGV[1])
return moved
