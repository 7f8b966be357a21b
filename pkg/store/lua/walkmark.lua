--[[ walkmark: reads and writes the mark of a changed max_rate's walk
(`reslot:<sink>` in the sinks hash) with what depends on it, in one step,
so that an operator's pause and a walker's word never cross: a pause made
during a walk stays after its end.
--! keys: sinks

ARGV[1]   the sink's walk mark field (reslotField in rate.go)
ARGV[2]   the sink's paused field (pausedField)
ARGV[3]   what to do:
            alive  the walk goes on: the mark's time becomes ARGV[3]
            pause  pause the sink (an operator's): a mark that would
                   resume it at the walk's end keeps it paused instead
            end    the walk ended: the mark goes, and the pause it made
                   with it (a mark "resume:")
ARGV[4]   alive: the time, Unix ms
returns   1, or 0 when the mark was gone (alive, end: another instance
          ended the walk)
]]

local field, paused, what = ARGV[1], ARGV[2], ARGV[3]
local mark = redis.call('HGET', K.sinks, field)
local how, at = '', ''
if mark then how, at = string.match(mark, '^([^:]*):(.*)$') end
if what == 'pause' then
  redis.call('HSET', K.sinks, paused, '1')
  if how == 'resume' then redis.call('HSET', K.sinks, field, 'keep:' .. at) end
  return 1
end
if not mark then return 0 end
if what == 'alive' then
  redis.call('HSET', K.sinks, field, how .. ':' .. ARGV[4])
elseif what == 'end' then
  if how == 'resume' then
    redis.call('HDEL', K.sinks, field, paused)
  else
    redis.call('HDEL', K.sinks, field)
  end
else
  error('walkmark: unknown action ' .. tostring(what))
end
return 1
