-- Close one block of adding jobs; when it was the last open block, fire whatever the
-- batch's jobs have made true meanwhile (an empty batch completes and succeeds here).
-- KEYS[1..4] the batch; KEYS[5] the set of queue names (in cluster mode, the hand-off
--          set, where callbacks go: see batch_lib.lua's push_callbacks)
-- ARGV[1] now; ARGV[2] the wake-up channel
local building = redis.call('HINCRBY', KEYS[1], 'building', -1)
if building < 0 then redis.call('HSET', KEYS[1], 'building', 0) end
settle_batch({KEYS[1], KEYS[2], KEYS[3], KEYS[4]}, ARGV[1], KEYS[5], ARGV[2])
return building
