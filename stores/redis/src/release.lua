-- release: give up our lock, whatever fencing token it was granted with (the token alone
-- identifies the holder, and a caller whose grant's reply was lost never learned the fence).
-- A fenced lock leaves its counter behind (T<fence>) until the server clock has passed it, so
-- the next grant's token is still higher.
-- A lock that took over a unit in doubt (`!`, see begin.lua) is left to run out instead, so
-- that the store remembers it for its memory: only a result ends a doubt.
-- KEYS[1] the unit's key
-- ARGV[1] our lock's value without the doubt it took over and its fencing token:
--   L<token>[~<memory>]
-- Returns 1 released | 0 not ours (expired or taken over)
local value = redis.call('GET', KEYS[1])
if value == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
if not value or string.sub(value, 1, #ARGV[1]) ~= ARGV[1] then
  return 0
end
local rest = string.sub(value, #ARGV[1] + 1)
local took = string.match(rest, '^!%d+:?%d*') or ''
local fence = string.match(string.sub(rest, #took + 1), '^%.(%d+)$')
if not fence and #rest > #took then
  return 0
end
if took ~= '' then
  local memory = tonumber(string.match(ARGV[1], '~(%d+)$')) or 0
  if memory > 0 then
    if redis.call('PTTL', KEYS[1]) > memory then
      redis.call('PEXPIRE', KEYS[1], memory)
    end
    return 1
  end
end
if not fence then
  return redis.call('DEL', KEYS[1])
end
local now = redis.call('TIME')
local ahead = tonumber(fence) - (tonumber(now[1]) * 1000000 + tonumber(now[2]))
redis.call('SET', KEYS[1], 'T' .. fence, 'PX', math.max(math.floor(ahead / 1000), 0) + 1000)
return 1
