-- forget: delete the completion marker on purpose; a lock is left alone. A marker with a
-- fencing token leaves its counter behind (T<fence>), as a released lock does.
-- KEYS[1] the unit's key
-- Returns 1 deleted | 0 no marker
local value = redis.call('GET', KEYS[1])
if not value or string.sub(value, 1, 1) ~= 'D' then
  return 0
end
local fence = string.match(value, '^D[^|]*,f(%d+)')
if not fence then
  return redis.call('DEL', KEYS[1])
end
local now = redis.call('TIME')
local ahead = tonumber(fence) - (tonumber(now[1]) * 1000000 + tonumber(now[2]))
redis.call('SET', KEYS[1], 'T' .. fence, 'PX', math.max(math.floor(ahead / 1000), 0) + 1000)
return 1
