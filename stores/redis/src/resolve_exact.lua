-- resolve_exact: settle a unit in doubt that an operator was shown, and only while it still is:
-- its key holds exactly the lock shown, and that lock has run out (its key has no more than
-- the lock's doubt memory left). Then either store a completion marker in its place, as a
-- finish would have, or free it: delete the lock, leaving a fenced lock's counter behind
-- (T<fence>) as a release does. A lock taken over, finished or renewed meanwhile stays as it
-- is. Like forget_exact.lua it leaves a receipt, so that a run the client re-sent after losing
-- the reply answers as the first run did and writes nothing more.
-- KEYS[1] the unit's key
-- KEYS[2] the unit's operator receipt (same hash slot)
-- KEYS[3] the unit's journal of steps, left alone but for a step's entry (ARGV[6]) and a free
-- that discards it (ARGV[8]): a freed unit replays the steps it recorded, and a resolved one's
-- journal expires before its marker
-- ARGV[1] the exact lock value that was shown: L<token>~<memory>[.<fence>]
-- ARGV[2] a nonce of this call
-- ARGV[3] how long the receipt lasts, in ms
-- ARGV[4] the marker to store, or '' to free the unit
-- ARGV[5] the marker's TTL in ms (with a marker)
-- ARGV[6] a step's journal entry to append before freeing the unit, or '' (with no marker)
-- ARGV[7] how long the journal is then kept, in ms (with an entry)
-- ARGV[8] '1' to delete the journal as the unit is freed (with no marker and no entry), else '0'
-- Returns 1 resolved (now or by this call's earlier run) | 0 the unit is free (nothing, or a
-- released fenced lock's counter) | -1 it holds something else now, or the same lock live again
if redis.call('GET', KEYS[2]) == ARGV[2] then
  return 1
end
-- pcall: a key of another type is "something else", not an error.
local value = redis.pcall('GET', KEYS[1])
-- Nothing, or a released fenced lock's counter: the unit is free, nothing is in doubt.
if not value or (type(value) == 'string' and string.sub(value, 1, 1) == 'T') then
  return 0
end
if value ~= ARGV[1] then
  return -1
end
local kept, fence = string.match(value, '^L[^~!.]*~(%d+)!?%d*:?%d*%.?(%d*)$')
local left = redis.call('PTTL', KEYS[1])
if not kept or left < 0 or left > tonumber(kept) then
  return -1
end
if ARGV[6] ~= '' then
  -- The first write, so that a server at maxmemory refuses the script before it frees
  -- anything: the unit is freed only with its step recorded. Nobody else appends while the
  -- unit is in doubt, and its holder's step.lua would find its lock changed.
  redis.call('RPUSH', KEYS[3], ARGV[6])
  redis.call('PEXPIRE', KEYS[3], ARGV[7])
end
if ARGV[4] ~= '' then
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5])
elseif fence == '' then
  redis.call('DEL', KEYS[1])
else
  -- The counter, as release.lua and the forget scripts leave it (change them together): the
  -- next grant's token stays above this one.
  local now = redis.call('TIME')
  local ahead = tonumber(fence) - (tonumber(now[1]) * 1000000 + tonumber(now[2]))
  redis.call('SET', KEYS[1], 'T' .. fence, 'PX', math.max(math.floor(ahead / 1000), 0) + 1000)
end
if ARGV[8] == '1' then
  -- After the unit is freed, which a server at maxmemory may refuse: a delete never is.
  redis.call('DEL', KEYS[3])
end
-- After the first write, as in forget.lua: a server at maxmemory checks only a script's first
-- write.
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
