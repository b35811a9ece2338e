-- renew: reset the lock's expiry only if it still holds our token.
-- KEYS[1] lock
-- ARGV[1] lock token, ARGV[2] lock TTL in ms
-- Returns 1 renewed | 0 not ours (expired or taken over)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
