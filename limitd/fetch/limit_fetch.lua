-- limit_fetch: take one job from the first eligible queue, in the order given, into this
-- capsule's in-progress list, and count the busy slot.
--
-- KEYS[1]  limitd:limits          hash  queue -> global limit (absent/non-number: none)
-- KEYS[2]  limitd:process_limits  hash  queue -> per-capsule limit
-- KEYS[3]  limitd:paused          set   paused queue names
-- KEYS[4]  limitd:busy            hash  queue -> jobs in progress in every capsule
-- KEYS[5]  limitd:capsule:<id>:queues  set of queues this capsule holds jobs from
-- KEYS[6]  limitd:capsules        set   capsule ids that may hold jobs
-- KEYS[5 + 2i], KEYS[6 + 2i]  for the i-th queue (i = 1..n): queue:<name> and
--          limitd:capsule:<id>:inprogress:<name>
-- ARGV[1]  this capsule's id
-- ARGV[2i], ARGV[2i + 1]  for the i-th queue: its name, and "1" if it is blocking
--
-- Returns {queue name, job} or false when no queue is eligible or all are empty.
--
-- Why atomic: the limit check, the pop and the slot count must not interleave with
-- other fetchers, or two of them could both see "2 of 3 busy" and take the third slot.
-- Cost: O(1) per queue tried (HGET, LLEN, SISMEMBER, LMOVE); nothing scans a list, so
-- the cost does not grow with the number of jobs in progress.
-- Registering the capsule with each job it takes means a job can never sit in the
-- in-progress list of a capsule the reaper does not know, even one fetched by a thread
-- of a capsule that already retired.
local limits, process_limits, paused, busy = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local held, capsules, capsule_id = KEYS[5], KEYS[6], ARGV[1]

local function at_limit(name, in_progress_key)
  local process_limit = tonumber(redis.call('HGET', process_limits, name))
  if process_limit and redis.call('LLEN', in_progress_key) >= process_limit then
    return true
  end
  local limit = tonumber(redis.call('HGET', limits, name))
  return limit ~= nil and tonumber(redis.call('HGET', busy, name) or '0') >= limit
end

for i = 1, (#ARGV - 1) / 2 do
  local name, blocking = ARGV[2 * i], ARGV[2 * i + 1] == '1'
  local queue_key, in_progress_key = KEYS[5 + 2 * i], KEYS[6 + 2 * i]
  if redis.call('SISMEMBER', paused, name) == 0 then
    if not at_limit(name, in_progress_key) then
      -- The oldest job (right end) moves to the left of the in-progress list.
      local job = redis.call('LMOVE', queue_key, in_progress_key, 'RIGHT', 'LEFT')
      if job then
        redis.call('HINCRBY', busy, name, 1)
        redis.call('SADD', held, name)
        redis.call('SADD', capsules, capsule_id)
        return {name, job}
      end
    elseif blocking and redis.call('LLEN', queue_key) > 0 then
      -- A blocking queue with work waiting for a slot: lower queues must not jump ahead.
      return false
    end
  end
end
return false
