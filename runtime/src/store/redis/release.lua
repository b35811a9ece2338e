-- release: give up our lock. A fenced lock leaves its counter behind (T<fence>) until the
-- server clock has passed it, so the next grant's token is still higher.
-- KEYS[1] the unit's key
-- ARGV[1] our lock's value, ARGV[2] its fencing token or ''
-- Returns 1 released | 0 not ours (expired or taken over)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  return redis.call('DEL', KEYS[1])
end
local now = redis.call('TIME')
local ahead = tonumber(ARGV[2]) - (tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
redis.call('SET', KEYS[1], 'T' .. ARGV[2], 'PX', math.max(ahead, 0) + 1000)
return 1
