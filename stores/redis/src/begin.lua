-- begin: the paths of `begin` that a plain `SET … NX GET` cannot take: a fenced grant, a
-- released fenced lock whose counter must go on, and another holder's lock that is kept past
-- its TTL (a doubt memory), which this script alone can tell from a live one.
-- KEYS[1] the unit's key
-- ARGV[1] lock token, ARGV[2] lock TTL in ms, ARGV[3] doubt memory in ms (0: none),
-- ARGV[4] '1' for a fencing token, ARGV[5] '1' to take over a unit in doubt
-- Values: D… marker | L<token>[~<memory>][!<expired ms>[:<earlier fence>]][.<fence>] lock
--   | T<fence> released fenced lock
-- A lock with a memory is kept for its TTL plus that memory: it ran out once its key has no
-- more than the memory left (the server's clock), and the unit is in doubt from then on.
-- `!` marks a lock that took over a unit in doubt, with the doubt it found: a repeated begin
-- answers it again, and release.lua lets such a lock run out rather than delete it.
-- Returns {1, marker} done | {2, fence or -1} acquired | {3, lock PTTL in ms} busy
--   | {4} foreign value | {5, fence or -1, expired ms, earlier fence or -1} taken over in doubt
--   | {6, expired ms, earlier fence or -1} in doubt, left alone (nothing written)
local value = redis.call('GET', KEYS[1])
local memory = tonumber(ARGV[3])
local key_ms = tonumber(ARGV[2]) + memory
local last = 0
local expired = nil
local earlier = -1
if value then
  local tag = string.sub(value, 1, 1)
  if tag == 'D' then
    return {1, value}
  elseif tag == 'L' then
    local holder, kept, took, found, fence =
      string.match(value, '^L([^~!.]*)~?(%d*)(!?%d*):?(%d*)%.?(%d*)$')
    if not holder then
      return {4}
    end
    if holder == ARGV[1] then
      -- A repeated call whose first reply was lost already holds the lock. Its expiry counts
      -- from that first call: set it from this one, as the caller counts.
      redis.call('PEXPIRE', KEYS[1], key_ms)
      if took ~= '' then
        return {5, tonumber(fence) or -1, tonumber(string.sub(took, 2)) or 0, tonumber(found) or -1}
      end
      return {2, tonumber(fence) or -1}
    end
    local left = redis.call('PTTL', KEYS[1])
    kept = tonumber(kept) or 0
    if left < 0 then
      return {3, left}
    end
    if kept == 0 or left > kept then
      return {3, left - kept}
    end
    expired = kept - left
    earlier = tonumber(fence) or -1
    if ARGV[5] ~= '1' then
      return {6, expired, earlier}
    end
    -- A fenced lock's successor goes on counting, fenced task or not.
    last = math.max(earlier, 0)
  elseif tag == 'T' then
    last = tonumber(string.sub(value, 2)) or 0
  else
    return {4}
  end
end
local lock = 'L' .. ARGV[1]
if memory > 0 then
  lock = lock .. '~' .. ARGV[3]
end
if expired then
  lock = lock .. '!' .. string.format('%.0f', expired)
  if earlier >= 0 then
    lock = lock .. ':' .. string.format('%.0f', earlier)
  end
end
local granted = -1
if ARGV[4] == '1' or last > 0 then
  -- Tokens never fall below the server clock in microseconds. No key is granted a lock more
  -- than once per microsecond, so the counter cannot run ahead of the clock, and tokens keep
  -- increasing after a lock expired with its counter; the released lock's counter keeps them
  -- strictly increasing in between. (Doubles hold these integers exactly until the year 2255.)
  local now = redis.call('TIME')
  granted = math.max(last + 1, tonumber(now[1]) * 1000000 + tonumber(now[2]))
  lock = lock .. '.' .. string.format('%.0f', granted)
end
redis.call('SET', KEYS[1], lock, 'PX', key_ms)
if expired then
  return {5, granted, expired, earlier}
end
return {2, granted}
