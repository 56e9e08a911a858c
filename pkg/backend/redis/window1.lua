-- ratelimitd: a lone fixed_window take on a window key (see window.lua for
-- the key layout), the call the Store sends when a flush carries exactly
-- one window decision of one hit: INCRBY the cost, PEXPIRE when that
-- created the key, DECRBY (DEL when created) when the count is over the
-- rate. It writes the same keys and values as window.lua, so the two mix
-- on one key.
--
-- KEYS   the window key.
-- ARGV   rate ttl_ms [cost] (cost 1 when absent; 1 <= cost < 10^15).
-- Reply  the count after the hit: at most rate, it was allowed; above,
--        denied and undone. A write the server refuses (OOM, READONLY)
--        still denies a hit that is over, from a GET; a hit that would be
--        allowed gets { error }.
local k, c = KEYS[1], ARGV[3]
local n = 1
if c then n = c + 0 else c = '1' end
local v = redis.pcall('INCRBY', k, c)
if type(v) ~= 'number' then
  local g = redis.pcall('GET', k)
  if type(g) == 'table' then return { g.err } end
  g = (tonumber(g) or 0) + n
  if g > ARGV[1] + 0 then return g end
  return { v.err }
end
if v > ARGV[1] + 0 then
  if v == n then redis.call('DEL', k) else redis.call('DECRBY', k, c) end
elseif v == n then
  redis.call('PEXPIRE', k, ARGV[2])
end
return v
