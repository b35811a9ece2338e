-- raise_fence: give a lock granted on this server the quorum's value: its fencing token (the
-- highest that the granting servers gave), so that this server's counter goes on from it after
-- a release, and the doubt the round took over, so that every server holds the value that the
-- holder's renew and finish compare.
-- KEYS[1] the unit's key
-- ARGV[1] the lock's value as this server granted it, ARGV[2] the value with the quorum's token
-- Returns 1 raised (or raised already by an earlier call) | 0 not our lock any more
local value = redis.call('GET', KEYS[1])
if value == ARGV[2] then
  return 1
end
if value ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
return 1
