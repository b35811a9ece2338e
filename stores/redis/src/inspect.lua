-- inspect: what is stored for one unit of work, changing nothing.
-- KEYS[1] the unit's key
-- Returns {value or false, PTTL in ms} (PTTL: -2 missing, -1 no expiry)
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}
