-- catch_up: give a server that missed records of a unit's journal the journal a majority of the
-- quorum's servers hold, for the lock's holder only, so that it carries the next records too.
-- KEYS[1] the unit's key
-- KEYS[2] the unit's journal (a list)
-- ARGV[1] our lock's value, ARGV[2] how long the journal is kept, in ms, ARGV[3..] the entries
-- Returns 1 written | 0 not our lock
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2])
for i = 3, #ARGV do
  redis.call('RPUSH', KEYS[2], ARGV[i])
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
