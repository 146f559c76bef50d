-- Reserve places for new copies (perform_with_capacity): as many as are free.
-- KEYS: see capacity_lib.lua.
-- ARGV[3] how long a reservation lasts if its copy never starts (seconds)
-- ARGV[4] remaining_work_count, as the caller just read it (caps the copies)
-- ARGV[5..] candidate jids, one per copy wanted (max_running_jobs of them at most)
-- Returns the number n of places reserved: the first n candidate jids are now queued.
-- Atomic: counting running and queued copies and adding to them must see one state,
-- or two refills at once would both fill the same free places.
local now, maximum = tonumber(ARGV[1]), tonumber(ARGV[2])
prune(now)
local free = maximum - redis.call('ZCARD', KEYS[1]) - redis.call('ZCARD', KEYS[2])
local wanted = math.min(free, tonumber(ARGV[4]), #ARGV - 4)
for i = 1, wanted do
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[4 + i])
end
redis.call('HSET', KEYS[3], 'remaining_work_count', ARGV[4])
note_state(now, maximum)
return math.max(wanted, 0)
