--[[ ops_retrydead: schedules a dead message again as a new version of
itself (a retry through the ingest rules, due now; pkg/ops RetryDead).
--! firing
--! keys: pool meta dead
--! include: blob group due series

ARGV[1]   message ID
ARGV[2]   the message to park: its blob (its due time is the retry's time)
ARGV[3]   its due time, Unix ms: its score
ARGV[4]   its priority (which due set)
ARGV[5]   its group ("" none)
returns   1 if it was dead and is scheduled now, 0 if it was not dead
          (retried, deleted or cancelled meanwhile): nothing changed
]]

local id = ARGV[1]
if not redis.call('ZSCORE', K.dead, id) then return 0 end
redis.call('ZREM', K.dead, id)
redis.call('HDEL', K.meta, id)
groupdel(blobinfo(redis.call('HGET', K.pool, id)).group, id)
redis.call('HSET', K.pool, id, ARGV[2])
redis.call('ZADD', zkey(tonumber(ARGV[4])), ARGV[3], id)
groupadd(ARGV[5], id)
series(id, blobinfo(ARGV[2]))
return 1
