-- release: delete the lock only if it still holds our token.
-- KEYS[1] lock
-- ARGV[1] lock token
-- Returns 1 released | 0 not ours (expired or taken over)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
