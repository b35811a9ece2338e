-- forget: delete the value an operator was shown, and only that value, so that a marker
-- written while the operator answered stays. A value with a fencing token leaves its counter
-- behind (T<fence>), as the store's own forget and a released lock do.
-- KEYS[1] the unit's key
-- ARGV[1] the exact value that was shown
-- Returns 1 deleted | 0 the key is gone | -1 it holds something else now
local value = redis.pcall('GET', KEYS[1])
if not value then
  return 0
end
if value ~= ARGV[1] then
  return -1
end
local fence = string.match(value, '^D[^|]*,f(%d+)')
if not fence then
  return redis.call('DEL', KEYS[1])
end
local now = redis.call('TIME')
local ahead = tonumber(fence) - (tonumber(now[1]) * 1000000 + tonumber(now[2]))
redis.call('SET', KEYS[1], 'T' .. fence, 'PX', math.max(math.floor(ahead / 1000), 0) + 1000)
return 1
