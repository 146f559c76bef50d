-- reap_capsule: return a dead capsule's in-progress jobs to the front of their queues and
-- free its busy slots, then forget the capsule. Each job returned counts one recovery (a
-- job that kills its process every time is caught after max_recoveries: see
-- limitd/fetch/recoveries.py).
--
-- KEYS[1]  limitd:capsule:<id>:heartbeat  (checked: a capsule that beat again is alive)
-- KEYS[2]  limitd:capsules   set of capsule ids
-- KEYS[3]  limitd:busy       hash queue -> jobs in progress
-- KEYS[4]  limitd:capsule:<id>:queues
-- KEYS[3 + 2i], KEYS[4 + 2i]  for the i-th queue: queue:<name>, and the capsule's
--          in-progress list for it
-- KEYS[#KEYS]  limitd:recoveries  hash sha1(job) -> recoveries, sha1(job):error -> why
-- ARGV[1]  the capsule id
-- ARGV[1 + i]  the i-th queue name
-- ARGV[#ARGV - 2]  the reason recorded for each job returned
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
-- requeued twice and no slot freed twice. The heartbeat is checked in the same call so
-- a capsule whose beat was only late is never reaped.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return -1
end
local queues = #ARGV - 4
local recoveries, reason = KEYS[#KEYS], ARGV[#ARGV - 2]
if redis.call('SCARD', KEYS[4]) > queues then
  return -2
end
local moved = 0
for i = 1, queues do
  local name = ARGV[1 + i]
  local queue_key, in_progress_key = KEYS[3 + 2 * i], KEYS[4 + 2 * i]
  local count = 0
  -- Newest first to the right end: the oldest ends rightmost and is fetched first.
  while true do
    local job = redis.call('LMOVE', in_progress_key, queue_key, 'LEFT', 'RIGHT')
    if not job then break end
    local id = redis.sha1hex(job)
    redis.call('HINCRBY', recoveries, id, 1)
    redis.call('HSET', recoveries, id .. ':error', reason)
    count = count + 1
  end
  if count > 0 then
    if redis.call('HINCRBY', KEYS[3], name, -count) < 0 then
      redis.call('HSET', KEYS[3], name, 0)
    end
    redis.call('PUBLISH', ARGV[#ARGV], name)
    moved = moved + count
  end
end
if moved > 0 then
  redis.call('EXPIRE', recoveries, ARGV[#ARGV - 1])
end
redis.call('DEL', KEYS[4])
redis.call('SREM', KEYS[2], ARGV[1])
return moved
