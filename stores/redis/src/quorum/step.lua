-- step (quorum): step.lua on one of the quorum's servers, telling its refusals apart, and able
-- to replace what an earlier, failed attempt left at the entry's position.
-- KEYS[1] the unit's key
-- KEYS[2] the unit's journal (a list)
-- ARGV[1] our lock's value, ARGV[2] the entry's position (0-based), ARGV[3] the entry,
-- ARGV[4] the unit key's TTL in ms (the lock's, with its doubt memory),
-- ARGV[5] how long the journal is kept, in ms,
-- ARGV[6] '1' to replace another entry at the position (and every entry after it), '0' not to
-- Returns 1 recorded (now, or by an earlier send of the same entry) | {0, entry or nil} not
-- our lock, with what this server holds at the position (so that the caller never replaces
-- an entry that a majority may hold counting this server) | {2, entry} another entry holds
-- the position (and ARGV[6] is '0') | 3 the journal here is shorter than the position (this
-- server missed an earlier record)
local position = tonumber(ARGV[2])
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0, redis.call('LINDEX', KEYS[2], position)}
end
local length = redis.call('LLEN', KEYS[2])
if position > length then
  return 3
end
if position < length then
  local held = redis.call('LINDEX', KEYS[2], position)
  if held == ARGV[3] then
    -- An earlier send recorded it and its reply was lost: the caller counts its lock from
    -- this send, so the lock is renewed as by a first one.
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
    redis.call('PEXPIRE', KEYS[1], ARGV[4])
    return 1
  end
  if ARGV[6] ~= '1' then
    return {2, held}
  end
  if position == 0 then
    redis.call('DEL', KEYS[2])
  else
    redis.call('LTRIM', KEYS[2], 0, position - 1)
  end
end
redis.call('RPUSH', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
