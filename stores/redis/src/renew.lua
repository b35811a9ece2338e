-- renew: reset our lock's expiry. Used where the server has no native compare-and-set.
-- KEYS[1] the unit's key
-- ARGV[1] our lock's value, ARGV[2] lock TTL in ms
-- Returns 1 renewed | 0 not ours (expired or taken over)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
