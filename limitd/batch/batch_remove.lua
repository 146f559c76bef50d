-- Take back jobs registered but not pushed (a middleware halted them, or the push
-- failed). Only called while the batch is open, so nothing can fire here.
-- KEYS[1..4] the batch; ARGV the jids
-- Returns how many were removed.
local removed = 0
for _, jid in ipairs(ARGV) do
  if redis.call('SREM', KEYS[2], jid) == 1 then
    redis.call('SREM', KEYS[3], jid)
    removed = removed + 1
  end
end
redis.call('HINCRBY', KEYS[1], 'total', -removed)
redis.call('HINCRBY', KEYS[1], 'pending', -removed)
renew({KEYS[1], KEYS[2], KEYS[3], KEYS[4]})
return removed
