-- read: what one key holds and the server's clock, changing nothing. Any type of key is read
-- without an error, so that a stray key under a task's pattern is named instead of failing
-- the whole listing.
-- KEYS[1] the key
-- Returns {TYPE, value or false (strings only), PTTL in ms (-2 missing, -1 no expiry), TIME}
local kind = redis.call('TYPE', KEYS[1])['ok']
local value = false
if kind == 'string' then
  value = redis.call('GET', KEYS[1])
end
return {kind, value, redis.call('PTTL', KEYS[1]), redis.call('TIME')}
