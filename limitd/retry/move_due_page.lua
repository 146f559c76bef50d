-- move_due_page: move the first page of due jobs of a sorted set (schedule or retry) to
-- their queues, reading them here: the poller sends no job and decodes none.
--
-- KEYS[1]  the sorted set the jobs wait in (schedule | retry)
-- KEYS[2]  the set of known queue names (queues)
-- ARGV[1]  now (epoch seconds, as a JSON number): members scored up to it are due, and
--          it is each moved job's enqueued_at
-- ARGV[2]  the page: how many due members to read at most
-- ARGV[3]  the wake-up channel (limitd:wake): idle capsules fetch the jobs at once
-- ARGV[4]  the queue key prefix ("queue:"): a queue's list is ARGV[4] .. its name
--
-- Returns {read, moved, member, member, ...}: how many due members the page held, how
-- many moved, and the members left where they were for the caller to move one by one
-- (each as enqueue_member.lua does, or to the dead set): those this script does not
-- read with certainty. A job moves here when it is 64 KiB at most, decodes to an
-- object with a non-empty "class" string, an "args" array and a "queue" string (or
-- none: "default"), and names "enqueued_at" once at most as text (its value is then
-- replaced there, else the field is added at the end). Anything else keeps its text
-- for the caller to judge.
--
-- The queues' keys are built here, from ARGV[4] and each job's "queue": which queues a
-- page goes to is known only by reading its jobs, and reading them here is the point.
-- So this script runs on a standalone server only; in a cluster each queue lives on its
-- own shard and due jobs move through the hand-off (limitd.handoff).
--
-- Why atomic: reading the due members and removing those it moves is one step, so
-- pollers of many processes each move a different page (none reads a page another
-- is moving, as they did when the reading was a ZRANGEBYSCORE of their own), and a job
-- is never lost between leaving the set and reaching its queue, nor pushed twice.
local page = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local stamp = ARGV[1]
-- A larger job is left to the caller: decoding a page of them here would hold the
-- server for as long as it took.
local DECODED_AT_MOST = 65536 -- bytes

-- Whether the decoded ``args`` of ``job`` were a JSON array: cjson decodes an object
-- to a table too, so its keys must be 1..n (and an empty one written as []).
local function an_array(args, job)
  local count = 0
  for _ in pairs(args) do count = count + 1 end
  if count == 0 then return string.find(job, '"args":[]', 1, true) ~= nil end
  return count == #args
end

-- The job with its enqueued_at set to now, and its queue; nil when unsure of either.
local function stamped(job)
  if #job > DECODED_AT_MOST or string.byte(job, -1) ~= 125 then return nil end -- '}'
  local ok, decoded = pcall(cjson.decode, job)
  if not ok or type(decoded) ~= 'table' then return nil end
  local queue = decoded.queue
  if queue == nil then queue = 'default' end
  if type(decoded.class) ~= 'string' or decoded.class == '' or type(queue) ~= 'string'
    or queue == '' or type(decoded.args) ~= 'table' or not an_array(decoded.args, job) then
    return nil
  end
  local first, last = string.find(job, '"enqueued_at":', 1, true)
  if not first then
    if decoded.enqueued_at ~= nil then return nil end -- named with escapes: unsure where
    return string.sub(job, 1, -2) .. ',"enqueued_at":' .. stamp .. '}', queue
  end
  if string.find(job, '"enqueued_at":', last + 1, true) then return nil end
  -- Its one mention is the top-level field (decoding found one): a number to replace.
  if type(decoded.enqueued_at) ~= 'number' then return nil end
  local value_end = select(2, string.find(job, '^%s*-?[%d.eE+-]+', last + 1))
  if not value_end then return nil end
  return string.sub(job, 1, last) .. stamp .. string.sub(job, value_end + 1), queue
end

local bodies, names, moved_members, left = {}, {}, {}, {#page, 0}
for _, job in ipairs(page) do
  local body, queue = stamped(job)
  if body then
    if not bodies[queue] then
      bodies[queue] = {}
      names[#names + 1] = queue
    end
    local list = bodies[queue]
    list[#list + 1] = body
    moved_members[#moved_members + 1] = job
  else
    left[#left + 1] = job
  end
end
left[2] = #moved_members
for first = 1, #moved_members, 1000 do
  redis.call('ZREM', KEYS[1], unpack(moved_members, first, math.min(first + 999, #moved_members)))
end
for _, queue in ipairs(names) do
  local list = bodies[queue]
  redis.call('SADD', KEYS[2], queue)
  -- LPUSH of many values pushes them in the order given, as one LPUSH each would.
  for first = 1, #list, 1000 do
    redis.call('LPUSH', ARGV[4] .. queue, unpack(list, first, math.min(first + 999, #list)))
  end
  redis.call('PUBLISH', ARGV[3], queue)
end
return left
