-- Open a batch for adding jobs: create it on first use, then count one more open block
-- (building), which holds its callbacks back until the block closes.
-- KEYS[1..4] the batch (see batch_lib.lua); KEYS[5] the index of batches (zset)
-- KEYS[6..9] the parent's four keys, when created nested
-- ARGV[1] bid        ARGV[2] now          ARGV[3] "1" to create, "0" to reopen only
-- ARGV[4] description ARGV[5] expires_in seconds ARGV[6] member (name in a parent's sets)
-- ARGV[7] parent bid or ""  ARGV[8] parent's four keys as JSON or ""
-- ARGV[9..11] success, complete and death callbacks as JSON, or ""
-- Returns 1 when open, 0 when the batch has already completed, -1 when it does not
-- exist and may not be created.
local meta = KEYS[1]
if redis.call('HGET', meta, 'complete_at') then return 0 end
if redis.call('EXISTS', meta) == 0 then
  if ARGV[3] ~= '1' then return -1 end
  redis.call('HSET', meta, 'bid', ARGV[1], 'created_at', ARGV[2], 'description', ARGV[4],
    'expires_in', ARGV[5], 'member', ARGV[6], 'total', 0, 'pending', 0, 'children', 0,
    'building', 0)
  local events = {'success', 'complete', 'death'}
  for i, event in ipairs(events) do
    if ARGV[8 + i] ~= '' then redis.call('HSET', meta, 'on_' .. event, ARGV[8 + i]) end
  end
  if ARGV[7] ~= '' then
    -- a child counts in its parent like a job until it completes and succeeds
    redis.call('HSET', meta, 'parent', ARGV[7], 'parent_keys', ARGV[8])
    redis.call('SADD', KEYS[7], ARGV[6])
    redis.call('SADD', KEYS[8], ARGV[6])
    redis.call('HINCRBY', KEYS[6], 'children', 1)
    renew({KEYS[6], KEYS[7], KEYS[8], KEYS[9]}) -- its sets may have been created anew
  end
  redis.call('ZADD', KEYS[5], ARGV[2], ARGV[1])
end
redis.call('HINCRBY', meta, 'building', 1)
renew({KEYS[1], KEYS[2], KEYS[3], KEYS[4]})
return 1
