-- Local functions shared by the batch scripts; LuaScript prepends this file to each, so
-- every batch operation is still one atomic script.
--
-- A batch is four keys, always in this order (limitd.keys.batch_keys):
--   k[1] meta hash: bid, description, counters (total, pending, children, building),
--        timestamps (created_at, complete_at, success_at, death_at), expires_in,
--        member (how its parent's sets name it), parent_keys, on_<event> callbacks
--   k[2] pending set: jids and child batches that have not succeeded yet
--   k[3] unfinished set: jids and child batches that have neither succeeded nor failed
--   k[4] failures hash: jid -> error of jobs whose last run failed
-- Key names come from Python: a parent's four names are stored as JSON in the child's
-- meta (parent_keys), a callback's queue key in its template (in cluster mode the
-- callback goes to the hand-off set instead: see push_callbacks). Nothing here builds
-- one.

-- Every change to a batch restarts its lifetime: its data expires `seconds` (the batch's
-- expires_in) after the last thing that happened to it. A batch nobody finishes (its
-- builder was killed inside jobs(), a dead job is never retried) so still goes away.
-- Used where a change may have created a key (SADD into a set that had emptied), so the
-- new key gets the lifetime of the rest. EXPIRE on a missing key does nothing.
local function keep_alive(k, seconds)
  if not seconds then return end
  for i = 1, 4 do redis.call('EXPIRE', k[i], seconds) end
end

-- keep_alive with the batch's own expires_in, for scripts that have not read its meta.
local function renew(k)
  keep_alive(k, redis.call('HGET', k[1], 'expires_in'))
end

-- keep_alive for changes that create no key (recording runs, firing), which happen
-- with every job: renew only once the lifetime has run down by a tenth of it, at most
-- an hour, so most calls read one TTL instead of writing four.
local function keep_alive_lazily(k, seconds)
  local left = redis.call('TTL', k[1])
  local slack = math.min(3600, math.floor(tonumber(seconds) / 10))
  if left < 0 or left < tonumber(seconds) - slack then keep_alive(k, seconds) end
end

-- What settle_batch needs of a batch's meta hash. expires_in is set when a batch is
-- created, so a false there means the batch does not exist (expired, or an unknown bid).
local function read_meta(k)
  return redis.call('HMGET', k[1], 'building', 'complete_at', 'success_at',
    'parent_keys', 'expires_in', 'member')
end

-- The first argument of every callback job: a small JSON snapshot of the batch.
local function batch_status(k, event)
  local f = redis.call('HMGET', k[1], 'bid', 'total', 'pending', 'description')
  return '{"bid":' .. cjson.encode(f[1] or '') .. ',"event":"' .. event ..
    '","total":' .. (f[2] or '0') .. ',"pending":' .. (f[3] or '0') ..
    ',"failures":' .. redis.call('HLEN', k[4]) ..
    ',"description":' .. cjson.encode(f[4] or '') .. '}'
end

-- Enqueue the callback jobs registered for an event. A template is a payload's JSON cut
-- where the status goes (head, tail), without its closing brace, so the payload is
-- rebuilt by concatenation: decoding and re-encoding it with cjson would turn empty
-- lists into objects and round the timestamps.
-- A hand-off entry's score while nobody has claimed it (see limitd/handoff.py): far in
-- the past, so any pusher takes it, and rising with the time and the order of the
-- callbacks, so they are pushed in the order they fired.
local handed_off = 0
local function unclaimed_score(now, sequence)
  return tonumber(now) - 1000000000 + sequence / 10000
end

local function push_callbacks(k, event, now, queues_key, wake_channel)
  local raw = redis.call('HGET', k[1], 'on_' .. event)
  if not raw then return end
  local status = batch_status(k, event)
  for _, cb in ipairs(cjson.decode(raw)) do
    local body = cb.head .. status .. cb.tail .. ',"enqueued_at":' .. now .. '}'
    if cb.handoff then
      -- Cluster mode: the queue is on another shard; the hand-off set (queues_key, the
      -- caller's KEYS[5] there) is in this one, and whoever ran this script pushes the
      -- callback next (limitd/handoff.py).
      handed_off = handed_off + 1
      redis.call('ZADD', queues_key, unclaimed_score(now, handed_off), body)
    else
      redis.call('LPUSH', cb.queue_key, body)
      redis.call('SADD', queues_key, cb.queue)
      redis.call('PUBLISH', wake_channel, cb.queue)
    end
  end
end

-- Fire what has just become true of batch k: complete (nothing unfinished), then
-- success (nothing pending), each once, and never while jobs are being added (building
-- > 0). A batch that fired carries itself out of its parent's sets, so the same checks
-- run up the tree until a batch has nothing new to report. Each batch visited has
-- changed, so each one's lifetime restarts. `m`: k's read_meta, if the caller has it.
local function settle_batch(k, now, queues_key, wake_channel, m)
  while k do
    m = m or read_meta(k)
    if not m[5] then return end -- expired, or an unknown bid
    keep_alive_lazily(k, m[5]) -- k has changed: the caller's batch, or a parent
    if tonumber(m[1] or '0') > 0 then return end
    local completed, succeeded = false, false
    if not m[2] and redis.call('SCARD', k[3]) == 0 then
      redis.call('HSET', k[1], 'complete_at', now)
      push_callbacks(k, 'complete', now, queues_key, wake_channel)
      completed = true
    end
    if (m[2] or completed) and not m[3] and redis.call('SCARD', k[2]) == 0 then
      redis.call('HSET', k[1], 'success_at', now)
      push_callbacks(k, 'success', now, queues_key, wake_channel)
      succeeded = true
    end
    if not (completed or succeeded) or not m[4] then return end
    local parent = cjson.decode(m[4])
    if completed then redis.call('SREM', parent[3], m[6]) end
    if succeeded then redis.call('SREM', parent[2], m[6]) end
    k, m = parent, nil
  end
end
