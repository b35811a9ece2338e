-- release: give up our lock, whatever fencing token it was granted with (the token alone
-- identifies the holder, and a caller whose grant's reply was lost never learned the fence).
-- A fenced lock leaves its counter behind (T<fence>) until the server clock has passed it, so
-- the next grant's token is still higher.
-- KEYS[1] the unit's key
-- ARGV[1] our lock's value without its fencing token: L<token>
-- Returns 1 released | 0 not ours (expired or taken over)
local value = redis.call('GET', KEYS[1])
if value == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
if not value or string.sub(value, 1, #ARGV[1] + 1) ~= ARGV[1] .. '.' then
  return 0
end
local fence = string.sub(value, #ARGV[1] + 2)
local now = redis.call('TIME')
local ahead = tonumber(fence) - (tonumber(now[1]) * 1000000 + tonumber(now[2]))
redis.call('SET', KEYS[1], 'T' .. fence, 'PX', math.max(math.floor(ahead / 1000), 0) + 1000)
return 1
