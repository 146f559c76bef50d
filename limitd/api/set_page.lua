-- set_page: the next page of a sorted set (schedule, retry, dead) for the admin
-- API's iterator, highest score (newest) first.
--
-- KEYS[1]   the sorted set
-- ARGV[1]   page size
-- ARGV[2]   the score of the last entry yielded ('+inf' on page one)
-- ARGV[3..] anchors: up to a page of members already yielded and not removed through
--           the API since, most recently yielded first (none on page one)
--
-- Returns the page as ZREVRANGE ... WITHSCORES does: member, score, member, score, ...
--
-- Why atomic: members are added and removed between two calls (pollers, failures,
-- the caller deleting what it iterates). The rank of the first anchor still present and
-- the page after it are read together, so the page starts right after what was seen,
-- even among members with equal scores. When no anchor is left, the page restarts at
-- the last score seen, inclusive: an entry may repeat, none is skipped.
local key = KEYS[1]
local size = tonumber(ARGV[1])
for i = 3, #ARGV do
  local rank = redis.call('ZREVRANK', key, ARGV[i])
  if rank then
    return redis.call('ZREVRANGE', key, rank + 1, rank + size, 'WITHSCORES')
  end
end
return redis.call('ZREVRANGEBYSCORE', key, ARGV[2], '-inf', 'WITHSCORES', 'LIMIT', 0, size)
