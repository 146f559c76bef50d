-- queue_page: the next page of a queue for the admin API's iterator (oldest first).
--
-- KEYS[1]   the queue list (queue:<name>): producers LPUSH, fetchers take from the right
-- ARGV[1]   page size
-- ARGV[2]   how many entries, counted from the right, the iterator has walked past
-- ARGV[3..] anchors: up to a page of entries already yielded and not removed through
--           the API since, most recently yielded first (none on page one)
--
-- Returns {offset, entries}: offset = how many entries sit right of this page (where
-- the iterator resumed), entries = the page as LRANGE gives it (newest first).
--
-- Why atomic: fetchers, deletes and pushes shift list positions between two calls.
-- The entries already seen that are still queued form the right end of the list, the
-- newest of them being the newest anchor still there. Finding it and reading the page
-- left of it in one call means the page starts right after what was seen. When no
-- anchor is left, fetchers took them and so everything older too (the list is FIFO):
-- starting again from the right then skips nothing.
local key = KEYS[1]
local size = tonumber(ARGV[1])
local walked = tonumber(ARGV[2])

local function resume()
  if #ARGV < 3 then
    return 0
  end
  local anchor = {}
  for i = 3, #ARGV do
    anchor[ARGV[i]] = true
  end
  -- Usually few seen entries went (say, the caller deleted some): the newest anchor
  -- left is within two pages of where the walk stopped. One LRANGE finds it.
  local top = math.min(walked, redis.call('LLEN', key))
  if top == 0 then
    return 0
  end
  local window = redis.call('LRANGE', key, -top, -math.max(1, top - 2 * size))
  for i, entry in ipairs(window) do
    if anchor[entry] then
      return top - i + 1
    end
  end
  -- Many went (fetchers): search each anchor from the right, newest anchor first.
  for i = 3, #ARGV do
    local pos = redis.call('LPOS', key, ARGV[i], 'RANK', -1, 'MAXLEN', walked)
    if pos then
      return redis.call('LLEN', key) - pos
    end
  end
  return 0
end

local offset = resume()
return {offset, redis.call('LRANGE', key, -(offset + size), -(offset + 1))}
