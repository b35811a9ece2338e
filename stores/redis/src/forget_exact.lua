-- forget_exact: delete the value an operator was shown, and only that value, so that a marker
-- written while the operator answered stays. A value with a fencing token leaves its counter
-- behind (T<fence>), as the store's own forget and a released lock do. Like forget.lua it
-- leaves a receipt, so that a run the client re-sent after losing the reply answers as the
-- first run did and deletes nothing more.
-- KEYS[1] the unit's key
-- KEYS[2] the unit's forget receipt (same hash slot)
-- KEYS[3] the unit's journal of steps (same hash slot): deleted with a marker, so that the
-- unit runs again from its first step
-- ARGV[1] the exact value that was shown
-- ARGV[2] a nonce of this forget call
-- ARGV[3] how long the receipt lasts, in ms
-- Returns 1 deleted (now or by this call's earlier run) | 0 the unit holds nothing (no key, or a
-- released fenced lock's counter) | -1 it holds something else now
if redis.call('GET', KEYS[2]) == ARGV[2] then
  return 1
end
-- pcall: a key of another type is "something else", not an error.
local value = redis.pcall('GET', KEYS[1])
-- Nothing, or the counter a forget or a release left: nothing is there to forget, as
-- resolve_exact.lua reads it too.
if not value or (type(value) == 'string' and string.sub(value, 1, 1) == 'T') then
  return 0
end
if value ~= ARGV[1] then
  return -1
end
-- This tail (counter, then receipt) is the same in forget.lua, and in resolve_exact.lua for a
-- lock: change them together.
local fence = string.match(value, '^D[^|]*,f(%d+)')
if not fence then
  redis.call('DEL', KEYS[1])
else
  local now = redis.call('TIME')
  local ahead = tonumber(fence) - (tonumber(now[1]) * 1000000 + tonumber(now[2]))
  redis.call('SET', KEYS[1], 'T' .. fence, 'PX', math.max(math.floor(ahead / 1000), 0) + 1000)
end
-- After the first write, as in forget.lua: a server at maxmemory checks only a script's first
-- write.
if string.sub(value, 1, 1) == 'D' then
  redis.call('DEL', KEYS[3])
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
