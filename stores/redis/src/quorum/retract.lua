-- retract: take back this delivery's marker from a server where it did not make a majority, so
-- that no duplicate replays a result the quorum never agreed on. Markers name their delivery,
-- so only this delivery's own marker can match; anything else is left as it is.
-- KEYS[1] the unit's key
-- ARGV[1] the marker as finished with the lock held, ARGV[2] as written after the lock expired
-- Returns 1 retracted | 0 not this delivery's marker
local value = redis.call('GET', KEYS[1])
if value == ARGV[1] or value == ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
