-- begin_fenced: the stored marker if the unit is done, else the lock with a new fencing token,
-- else busy. Also the plain begin's answer to a released fenced lock, whose counter must go on.
-- KEYS[1] the unit's key
-- ARGV[1] lock token, ARGV[2] lock TTL in ms
-- Values: D… marker | L<token>[.<fence>] lock | T<fence> released fenced lock
-- Returns {1, marker} done | {2, fence} acquired | {3, lock PTTL in ms} busy | {4} foreign value
local value = redis.call('GET', KEYS[1])
local last = 0
if value then
  local tag = string.sub(value, 1, 1)
  if tag == 'D' then
    return {1, value}
  elseif tag == 'L' then
    -- A repeated call whose first reply was lost already holds the lock.
    local mine = 'L' .. ARGV[1] .. '.'
    if string.sub(value, 1, #mine) == mine then
      -- Its expiry counts from that first call: set it from this one, as the caller counts.
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
      return {2, tonumber(string.sub(value, #mine + 1)) or 0}
    end
    return {3, redis.call('PTTL', KEYS[1])}
  elseif tag == 'T' then
    last = tonumber(string.sub(value, 2)) or 0
  else
    return {4}
  end
end
-- Tokens never fall below the server clock in microseconds. No key is granted a lock more than
-- once per microsecond, so the counter cannot run ahead of the clock, and tokens keep increasing
-- after a lock expired with its counter; the released lock's counter keeps them strictly
-- increasing in between. (Doubles hold these integers exactly until the year 2255.)
local now = redis.call('TIME')
local fence = math.max(last + 1, tonumber(now[1]) * 1000000 + tonumber(now[2]))
redis.call('SET', KEYS[1], 'L' .. ARGV[1] .. '.' .. string.format('%.0f', fence), 'PX', ARGV[2])
return {2, fence}
