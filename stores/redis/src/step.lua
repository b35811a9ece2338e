-- step: append a finished step's entry to the unit's journal, for the lock's holder only, at
-- the journal's next position, and renew the lock.
-- KEYS[1] the unit's key
-- KEYS[2] the unit's journal (a list, same hash slot)
-- ARGV[1] our lock's value, ARGV[2] the entry's position (0-based), ARGV[3] the entry,
-- ARGV[4] the unit key's TTL in ms (the lock's, with its doubt memory),
-- ARGV[5] how long the journal is kept, in ms
-- Returns 1 recorded (now, or by an earlier send of the same entry) | 0 not ours, or another
-- entry holds the position
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local position = tonumber(ARGV[2])
local length = redis.call('LLEN', KEYS[2])
if position < length then
  if redis.call('LINDEX', KEYS[2], position) == ARGV[3] then
    -- An earlier send recorded it and its reply was lost: the caller counts its lock from
    -- this send, so the lock is renewed as by a first one.
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
    redis.call('PEXPIRE', KEYS[1], ARGV[4])
    return 1
  end
  return 0
end
if position > length then
  return 0
end
redis.call('RPUSH', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
