-- Trims a stream up to the oldest entry that some consumer group has not acknowledged, so that
-- no pending entry and no entry a group has yet to read is removed: for each group, the floor
-- is its oldest pending id, or, with nothing pending, the id after its last delivered one; the
-- stream keeps every entry from the lowest floor on (XTRIM MINID). A stream without groups is
-- left as it is. One script, so that no read or ack of another client falls between the
-- floors and the trim.
-- KEYS[1]: the stream.
-- Returns: how many entries were removed.

local function parts(id)
  return string.match(id, '^(%d+)-(%d+)$')
end

-- Decimal strings without leading zeros, of any length.
local function below(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

local function earlier(a, b)
  local am, as = parts(a)
  local bm, bs = parts(b)
  if am ~= bm then return below(am, bm) end
  return below(as, bs)
end

local function increment(digits)
  local i = #digits
  local tail = ''
  while i > 0 do
    local d = string.byte(digits, i) - 48
    if d < 9 then
      return string.sub(digits, 1, i - 1) .. string.char(d + 49) .. tail
    end
    tail = '0' .. tail
    i = i - 1
  end
  return '1' .. tail
end

local function after(id)
  local ms, seq = parts(id)
  if seq == '18446744073709551615' then
    return increment(ms) .. '-0'
  end
  return ms .. '-' .. increment(seq)
end

local floor = nil
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, last
  for i = 1, #group, 2 do
    if group[i] == 'name' then name = group[i + 1] end
    if group[i] == 'last-delivered-id' then last = group[i + 1] end
  end
  local pending = redis.call('XPENDING', KEYS[1], name)
  local own
  if pending[1] > 0 then own = pending[2] else own = after(last) end
  if floor == nil or earlier(own, floor) then floor = own end
end
if floor == nil then return 0 end
return redis.call('XTRIM', KEYS[1], 'MINID', floor)
