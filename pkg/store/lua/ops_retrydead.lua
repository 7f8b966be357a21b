--[[ ops_retrydead: schedules a dead message again as a new version of
itself (a retry through the ingest rules, due now; pkg/ops RetryDead).
--! firing
--! keys: pool meta dead
--! include: blob group due series dead

ARGV[1]   the most live series the shard may hold under limits.max_series
          (-1: no bound; seriesbound.go)
ARGV[2]   message ID
ARGV[3]   the message to park: its blob (its due time is the retry's time)
ARGV[4]   its due time, Unix ms: its score
ARGV[5]   its priority (which due set)
ARGV[6]   its group ("" none)
ARGV[7]   the same under its source's ingest[].max_series (-1: no bound)
returns   1 if it was dead and is scheduled now; 0 if it was not dead
          (retried, deleted or cancelled meanwhile), R.OVERSERIES or
          R.OVERSOURCE if it recurs and would be a series past either
          bound (ARGV[1], ARGV[7]), as park refuses a new one: nothing changed
          then
]]

local id = ARGV[2]
if not redis.call('ZSCORE', K.dead, id) then return 0 end
local info = blobinfo(ARGV[3])
local over = overseries(tonumber(ARGV[1]), id, recurs(ARGV[3]), info.ingest, tonumber(ARGV[7]))
if over == 'max_series' then return R.OVERSERIES elseif over then return R.OVERSOURCE end
undead(id, redis.call('HGET', K.pool, id))
redis.call('HDEL', K.meta, id)
groupdel(blobinfo(redis.call('HGET', K.pool, id)).group, id)
redis.call('HSET', K.pool, id, ARGV[3])
put(tonumber(ARGV[5]), id, ARGV[4])
groupadd(ARGV[6], id)
series(id, info)
live(info.ingest, 1)
return 1
