-- finish: store the completion marker; release the lock only if it is still ours.
-- KEYS[1] lock, KEYS[2] done marker
-- ARGV[1] lock token, ARGV[2] marker, ARGV[3] result TTL in ms
-- Returns 1 completed | 2 lock lost, marker written | 3 lock lost, another marker kept
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  redis.call('DEL', KEYS[1])
  return 1
end
local existing = redis.call('GET', KEYS[2])
-- The same marker means an earlier call of ours succeeded and only its reply was lost.
if existing == ARGV[2] then
  return 1
end
if existing then
  return 3
end
-- The lock expired (someone else may hold it now): never touch it, but keep the result.
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 2
