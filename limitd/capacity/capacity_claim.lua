-- A copy starts: take a running place if there is one.
-- KEYS: see capacity_lib.lua.
-- ARGV[3] the copy's jid
-- ARGV[4] lease in seconds (renewed while the copy runs; a copy killed stops renewing)
-- Returns 1 when the copy may run, 0 when max_running_jobs copies already run.
-- A copy that already holds a place (one requeued after its process died, running
-- again under the same jid) keeps it.
-- Atomic: two copies starting at once must not both take the last place.
local now, maximum, jid = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
prune(now)
redis.call('ZREM', KEYS[2], jid)
local allowed = 0
if redis.call('ZSCORE', KEYS[1], jid) or redis.call('ZCARD', KEYS[1]) < maximum then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), jid)
  allowed = 1
end
note_state(now, maximum)
return allowed
