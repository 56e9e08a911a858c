-- now is the instant of the segment being decided (set per segment below);
-- every function reads it. pinned: the segment's now came from ARGV.
local now
local pinned = false
local server_now = 0
if needtime then
  local t = call('TIME')
  server_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- cache: key -> its current string value, or false when it is known to
-- be absent; nil (not in the table): unknown, read it with GET. Filled
-- by the MGET below, updated by every SET/DEL of a string kind, cleared
-- for a key a sorted-set write touches.
local cache = {}
if nskeys > 0 then
  -- In chunks (unpack of more than LUAI_MAXCSTACK values fails). An MGET
  -- or EXISTS the server refuses (e.g. ACL) only leaves keys unknown.
  local missing, nmissing = {}, 0
  for c0 = 1, nskeys, 1000 do
    local c1 = min(c0 + 999, nskeys)
    local ok, vals = pcall(call, 'MGET', unpack(skeys, c0, c1))
    if ok then
      for i = c0, c1 do
        local v = vals[i - c0 + 1]
        if v then
          cache[skeys[i]] = v
        else
          nmissing = nmissing + 1
          missing[nmissing] = skeys[i]
        end
      end
    end
  end
  -- MGET answers nil for an absent key and for a key of another type
  -- (which GET fails with WRONGTYPE): absent only if none exists.
  if nmissing > 0 and nmissing <= 1000 then
    local ok, n = pcall(call, 'EXISTS', unpack(missing, 1, nmissing))
    if ok and n == 0 then
      for i = 1, nmissing do cache[missing[i]] = false end
    end
  end
end

-- sget is GET through the cache.
local function sget(key)
  local v = cache[key]
  if v == nil then v = call('GET', key) end
  return v
end
