-- periodic: claim one tick of one periodic entry, for one scheduler.
--
-- KEYS[1]  limitd:periodic:<name>  hash: last_tick (epoch seconds), last_jid,
--          last_run_at (epoch seconds when the tick was claimed)
-- ARGV[1]  the tick (epoch seconds)
-- ARGV[2]  the jid the claimer will push
-- ARGV[3]  now (epoch seconds)
--
-- Returns false when the entry already ran at this tick or a later one; otherwise
-- {last_tick, last_jid, last_run_at} as they were before the claim ('' when unset),
-- which the claimer needs to give the claim back if its push fails.
--
-- Why atomic: every scheduler of every process tries each tick; reading last_tick and
-- writing the new one in one script lets exactly one of them win, with no leader.
local key, tick = KEYS[1], tonumber(ARGV[1])
local previous = redis.call('HMGET', key, 'last_tick', 'last_jid', 'last_run_at')
if previous[1] and tonumber(previous[1]) >= tick then
  return false
end
redis.call('HSET', key, 'last_tick', ARGV[1], 'last_jid', ARGV[2], 'last_run_at', ARGV[3])
return {previous[1] or '', previous[2] or '', previous[3] or ''}
