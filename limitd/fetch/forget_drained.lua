-- forget_drained: take queues whose in-progress list this capsule emptied out of the set
-- of queues it holds jobs from, so that the set (read by every heartbeat's orphan scan and
-- by the reaper) stays as small as what the capsule runs, not as large as every queue it
-- ever took a job from.
--
-- KEYS[1]       limitd:capsule:<id>:queues  set of queues this capsule holds jobs from
-- KEYS[1 + i]   limitd:capsule:<id>:inprogress:<name>  the i-th queue's in-progress list
-- ARGV[i]       the i-th queue's name
--
-- Returns how many queues left the set.
--
-- Why atomic: the caller saw those lists empty, but a fetch may have pushed to one since
-- (and its SADD found the name already there). Checking the list and removing the name
-- in one script keeps every queue with an entry in the set, so a reaper that takes this
-- capsule for dead still finds each of its jobs.
local removed = 0
for i, name in ipairs(ARGV) do
  if redis.call('EXISTS', KEYS[1 + i]) == 0 then
    removed = removed + redis.call('SREM', KEYS[1], name)
  end
end
return removed
