-- Register jobs in a batch before they are pushed, so a job that finishes at once is
-- already counted. Adding a jid twice counts it once.
-- KEYS[1..4] the batch; ARGV the jids
-- Returns how many jids were new.
local added = 0
for _, jid in ipairs(ARGV) do
  if redis.call('SADD', KEYS[2], jid) == 1 then
    redis.call('SADD', KEYS[3], jid)
    added = added + 1
  end
end
redis.call('HINCRBY', KEYS[1], 'total', added)
redis.call('HINCRBY', KEYS[1], 'pending', added)
renew({KEYS[1], KEYS[2], KEYS[3], KEYS[4]})
return added
