-- finish: replace our lock with the completion marker; never touch another holder's lock.
-- Used where the server has no native compare-and-set (`SET … IFEQ`).
-- KEYS[1] the unit's key
-- ARGV[1] our lock's value, ARGV[2] marker, ARGV[3] result TTL in ms
-- Returns 1 completed | 2 lock lost, marker written | 3 lock lost, nothing written
-- Markers name their delivery, so finding ours means an earlier call of ours applied and only
-- its reply was lost (a client that re-sends, a retry): the answer is the one that call had.
local value = redis.call('GET', KEYS[1])
if value == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if value == ARGV[2] then
  return 1
end
-- Written after the lock expired, the marker says so (`,l` in its header).
local lost = string.gsub(ARGV[2], '|', ',l|', 1)
if value == lost then
  return 2
end
-- Our lock expired. Nobody else holds the unit (nothing, or a released fenced lock): keep the
-- result. Another holder's lock or another marker stays as it is.
if not value or string.sub(value, 1, 1) == 'T' then
  redis.call('SET', KEYS[1], lost, 'PX', ARGV[3])
  return 2
end
return 3
