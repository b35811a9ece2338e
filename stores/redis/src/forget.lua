-- forget: delete the completion marker on purpose; a lock is left alone. A marker with a
-- fencing token leaves its counter behind (T<fence>), as a released lock does.
-- A client may run this twice for one call (the cluster client re-sends a command whose reply
-- it lost): the receipt tells the second run that the first deleted the marker, so it answers
-- 1 again and deletes nothing, not even a marker a later delivery wrote in between.
-- KEYS[1] the unit's key
-- KEYS[2] the unit's forget receipt (same hash slot)
-- KEYS[3] the unit's journal of steps (same hash slot): a forgotten unit runs again from its
-- first step
-- ARGV[1] a nonce of this forget call
-- ARGV[2] how long the receipt lasts, in ms
-- Returns 1 deleted (now or by this call's earlier run) | 0 no marker
if redis.call('GET', KEYS[2]) == ARGV[1] then
  return 1
end
local value = redis.call('GET', KEYS[1])
if not value or string.sub(value, 1, 1) ~= 'D' then
  return 0
end
-- This tail (counter, then receipt) is the same in forget_exact.lua, and in resolve_exact.lua
-- for a lock: change them together.
local fence = string.match(value, '^D[^|]*,f(%d+)')
if not fence then
  redis.call('DEL', KEYS[1])
else
  local now = redis.call('TIME')
  local ahead = tonumber(fence) - (tonumber(now[1]) * 1000000 + tonumber(now[2]))
  redis.call('SET', KEYS[1], 'T' .. fence, 'PX', math.max(math.floor(ahead / 1000), 0) + 1000)
end
-- After the first write: a server at maxmemory checks only a script's first write, so the
-- receipt never fails a forget that deleted, and a plain marker (DEL) can still be forgotten.
redis.call('DEL', KEYS[3])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
