-- fair_tenant: count enqueues of one tenant's job and pick each job's queue.
--
-- KEYS[1]  the tenant's enqueues: sorted set, member jid, score enqueue time
-- KEYS[2]  limitd:fair_tenant:tenants   zset JSON [job, tenant] -> last enqueue time
-- KEYS[3]  limitd:fair_tenant:reroutes  hash JSON [job, tenant, queue, rule number]
--          -> jobs that rule rerouted
-- KEYS[4]  limitd:fair_tenant:rules     hash job -> its rules (JSON), for the admin API
-- ARGV[1]  now (epoch seconds)
-- ARGV[2]  max_throttling_window (seconds): older entries are trimmed, the key expires
-- ARGV[3]  the job's name
-- ARGV[4]  the tenant
-- ARGV[5]  the job's rules as JSON (stored for the admin API)
-- ARGV[6]  number of rules r
-- ARGV[7 .. 6 + 3r]  per rule: window seconds, threshold, queue name
-- ARGV[7 + 3r ..]    the jids to enqueue, in order
--
-- Returns, per jid, the 1-based index of the rule that decides its queue, or 0 to keep
-- the job's own queue. A jid counts toward its own threshold: a rule matches when the
-- enqueues in its window, this one included, exceed its threshold. The last matching
-- rule wins, so rules go from least to most restrictive.
--
-- Why atomic: trimming, adding and counting in one call means concurrent enqueues of
-- the same tenant each see a count that includes every enqueue before them, exactly
-- once; in separate calls two enqueues can both see the count before either was added.
local key, now, window = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
local job, tenant = ARGV[3], ARGV[4]
local rules = tonumber(ARGV[6])
local first_jid = 7 + 3 * rules

redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)

-- Every jid of this call gets the same score, so the i-th one sees each rule's count
-- before the call plus i: one ZCOUNT per rule, not one per rule and job. (jids are new
-- per push, so each ZADD below adds a member.)
local before = {}
for r = 1, rules do
  local per = tonumber(ARGV[7 + 3 * (r - 1)])
  before[r] = redis.call('ZCOUNT', key, '(' .. (now - per), '+inf')
end

local decisions, rerouted, members = {}, {}, {}
for j = first_jid, #ARGV do
  local position = j - first_jid + 1
  local chosen = 0
  for r = 1, rules do
    if before[r] + position > tonumber(ARGV[7 + 3 * (r - 1) + 1]) then
      chosen = r
    end
  end
  if chosen > 0 then
    rerouted[chosen] = (rerouted[chosen] or 0) + 1
  end
  decisions[position] = chosen
  members[#members + 1] = now
  members[#members + 1] = ARGV[j]
end
-- In slices: unpack() has a limit on how many values it returns.
for first = 1, #members, 2000 do
  redis.call('ZADD', key, unpack(members, first, math.min(first + 1999, #members)))
end
for r, count in pairs(rerouted) do
  local queue = ARGV[7 + 3 * (r - 1) + 2]
  redis.call('HINCRBY', KEYS[3], cjson.encode({job, tenant, queue, tostring(r)}), count)
end
redis.call('EXPIRE', key, math.ceil(window))
-- The index of tenants keeps those seen within the longest window only.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
redis.call('ZADD', KEYS[2], now, cjson.encode({job, tenant}))
redis.call('HSET', KEYS[4], job, ARGV[5])
return decisions
