-- begin: the stored result if the unit is done, else the lock and a new fencing token, else busy.
-- KEYS[1] lock, KEYS[2] done marker, KEYS[3] fencing counter (one hash slot: same {tag})
-- ARGV[1] lock token, ARGV[2] lock TTL in ms, ARGV[3] fencing counter TTL in ms
-- Returns {1, marker} done | {2, fencing token} acquired | {3, lock PTTL in ms} busy
local marker = redis.call('GET', KEYS[2])
if marker then
  return {1, marker}
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- Tokens never fall below the server clock in ms, so they keep increasing even after an
  -- idle unit's counter expired; the stored counter keeps them strictly increasing in between.
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local last = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
  local fence = math.max(last + 1, floor)
  redis.call('SET', KEYS[3], string.format('%.0f', fence), 'PX', ARGV[3])
  return {2, fence}
end
-- A repeated call whose first reply was lost already holds the lock.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return {2, tonumber(redis.call('GET', KEYS[3]) or '0') or 0}
end
return {3, redis.call('PTTL', KEYS[1])}
