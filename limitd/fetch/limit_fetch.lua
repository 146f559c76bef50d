-- limit_fetch: settle the job this thread finished (optional), then take one job from
-- the first eligible queue (optional), in one call.
--
-- KEYS[1]  limitd:limits          hash  queue -> global limit (absent/non-number: none)
-- KEYS[2]  limitd:process_limits  hash  queue -> per-capsule limit
-- KEYS[3]  limitd:paused          set   paused queue names
-- KEYS[4]  limitd:busy            hash  queue -> jobs in progress in every capsule
-- KEYS[5]  limitd:capsule:<id>:queues  set of queues this capsule holds jobs from
-- KEYS[6]  limitd:capsules        set   capsule ids that may hold jobs
-- KEYS[7], KEYS[8]  the settled job's in-progress list and queue list (any key when
--          ARGV[2] is empty)
-- KEYS[7 + 2i], KEYS[8 + 2i]  for the i-th queue to fetch from (i = 1..n): queue:<name>
--          and limitd:capsule:<id>:inprogress:<name>
-- ARGV[1]  this capsule's id
-- ARGV[2]  the settled job exactly as fetched, or "" for none
-- ARGV[3]  its queue name
-- ARGV[4]  "ack" (done with it) or "requeue" (push it back to the front of its queue)
-- ARGV[5]  the wake-up channel (limitd:wake)
-- ARGV[4 + 2i], ARGV[5 + 2i]  for the i-th queue: its name, and "1" if it is blocking
--
-- Returns {settled, queue name, job}, or {settled} when nothing was taken; settled is 1
-- if the settled job was this capsule's, 0 if it was not in its in-progress list.
--
-- Why atomic: the limit check, the pop and the slot count must not interleave with
-- other fetchers, or two of them could both see "2 of 3 busy" and take the third slot.
-- Settling removes the in-progress entry and frees the slot together, which keeps the
-- busy count equal to the number of in-progress entries. The entry is the proof of
-- ownership: a capsule that was reaped (its jobs requeued, its slots freed by another
-- process) finds nothing to remove, so its late ack frees no slot it no longer holds.
-- Settling in the same call as the next fetch halves the round trips per job.
--
-- Cost: O(1) per queue tried (HGET, LLEN, SISMEMBER, LMOVE), nothing scans a queue or a
-- busy count; only settling scans this capsule's own in-progress list (LREM), whose
-- length is bounded by the capsule's threads.
local limits, process_limits, paused, busy = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local held, capsules, capsule_id, channel = KEYS[5], KEYS[6], ARGV[1], ARGV[5]

local function settle(in_progress_key, queue_key, job, name, mode)
  if redis.call('LREM', in_progress_key, 1, job) == 0 then
    return 0
  end
  local left = redis.call('HINCRBY', busy, name, -1)
  if left < 0 then
    redis.call('HSET', busy, name, 0)
  end
  if mode == 'requeue' then
    redis.call('RPUSH', queue_key, job)
    redis.call('PUBLISH', channel, name)
  elseif left + 1 == tonumber(redis.call('HGET', limits, name))
      and redis.call('LLEN', queue_key) > 0 then
    -- This freed the last slot of a queue at its limit, with jobs waiting for it.
    redis.call('PUBLISH', channel, name)
  end
  return 1
end

local function at_limit(name, in_progress_key)
  local process_limit = tonumber(redis.call('HGET', process_limits, name))
  if process_limit and redis.call('LLEN', in_progress_key) >= process_limit then
    return true
  end
  local limit = tonumber(redis.call('HGET', limits, name))
  return limit ~= nil and tonumber(redis.call('HGET', busy, name) or '0') >= limit
end

local settled = 0
if ARGV[2] ~= '' then
  settled = settle(KEYS[7], KEYS[8], ARGV[2], ARGV[3], ARGV[4])
end

for i = 1, (#ARGV - 5) / 2 do
  local name, blocking = ARGV[4 + 2 * i], ARGV[5 + 2 * i] == '1'
  local queue_key, in_progress_key = KEYS[7 + 2 * i], KEYS[8 + 2 * i]
  -- An empty queue is skipped before its limits are read: an idle poll costs one LLEN
  -- (and one SISMEMBER) per queue.
  if redis.call('LLEN', queue_key) > 0 and redis.call('SISMEMBER', paused, name) == 0 then
    if not at_limit(name, in_progress_key) then
      -- The oldest job (right end) moves to the left of the in-progress list.
      local job = redis.call('LMOVE', queue_key, in_progress_key, 'RIGHT', 'LEFT')
      if job then
        redis.call('HINCRBY', busy, name, 1)
        redis.call('SADD', held, name)
        redis.call('SADD', capsules, capsule_id)
        return {settled, name, job}
      end
    elseif blocking then
      -- A blocking queue with work waiting for a slot: lower queues must not jump ahead.
      return {settled}
    end
  end
end
return {settled}
