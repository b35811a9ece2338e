-- inspect: what is stored for one unit of work, changing nothing.
-- KEYS[1] lock, KEYS[2] done marker
-- Returns {marker or false, marker PTTL in ms, lock PTTL in ms} (PTTL: -2 missing, -1 no expiry)
return {redis.call('GET', KEYS[2]), redis.call('PTTL', KEYS[2]), redis.call('PTTL', KEYS[1])}
