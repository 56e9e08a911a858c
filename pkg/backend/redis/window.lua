-- ratelimitd: fixed_window with the window in the key (Options.WindowKeys).
-- A key is "<base>:<window_start_us>" (the base wrapped in {…} when it has
-- no hash tag, so the key hashes like the base), its value a plain
-- integer count, its TTL one period set when the key is created. The
-- Go side computes each key's window from its estimate of the server's
-- clock; the script checks every class's window against the server's
-- TIME (read once) and refuses a segment of a class whose window is not
-- the server's current one (status 1: nothing written, Go retries with the
-- server's now), so the counting clock is the server's, as in take.lua.
--
-- KEYS   one key per hit, segments in order.
-- ARGV   now ("" for TIME), C, then per class rate period_us ws ttl_ms,
--        then S and per segment mode (t take, d denied, r refund), n, then
--        per hit code (class * 8 + flags: 1 release, 2 soft, 4 charge)
--        and cost.
-- Reply  an array: now_us, then per segment a status (0 decided, 1 stale
--        window, or the error text) and, when 0, per hit allowed (0/1)
--        and remaining.
local ARGV, KEYS = ARGV, KEYS
local call, tonumber, min, max, format = redis.call, tonumber, math.min, math.max, string.format
local BIG = 9007199254740992
local now
if ARGV[1] == '' then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local nc = tonumber(ARGV[2])
local RATE, TTL, OK = {}, {}, {}
local p = 3
for c = 0, nc - 1 do
  local rate, period, ws = tonumber(ARGV[p]), tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])
  RATE[c], TTL[c] = rate, ARGV[p + 3]
  OK[c] = now - now % period == ws
  p = p + 4
end
local ns = tonumber(ARGV[p])
p = p + 1
local out, no = { now }, 1
local k = 0 -- KEYS consumed

-- general decides a segment of any shape exactly like pkg/algo's
-- fixedWindow over tentative counts (a repeated key sees its earlier hits),
-- all-or-nothing: reads first, then writes the difference per key.
local general
local function define_general()
general = function(mode, n, a0, k0)
  local cnt, first, keys = {}, {}, {}
  for i = 1, n do
    local key = KEYS[k0 + i]
    keys[i] = key
    if first[key] == nil then
      local v = call('GET', key)
      first[key] = tonumber(v) or 0
      cnt[key] = first[key]
    end
  end
  local AL, RM, denied = {}, {}, mode == 'd'
  local kept = {}
  for i = 1, n do
    local code = tonumber(ARGV[a0 + 2 * i - 1])
    local cost = tonumber(ARGV[a0 + 2 * i])
    local c, f = (code - code % 8) / 8, code % 8
    local rel, soft, charge = f % 2 == 1, f % 4 >= 2, f >= 4
    local key, rate = keys[i], RATE[c]
    local count = cnt[key]
    kept[i] = rel or charge
    if mode == 'r' then
      -- reverse a take: its window is the key's; a count already gone
      -- stays gone.
      if cost > 0 and count > 0 then cnt[key] = max(count - cost, 0) end
    elseif rel then
      AL[i], RM[i] = true, max(rate - max(count - cost, 0), 0)
      cnt[key] = max(count - cost, 0)
    else
      local rem = max(rate - count, 0)
      if max(cost, 1) > rem then
        AL[i], RM[i] = false, rem
        if charge and cost > 0 then
          cnt[key], RM[i] = min(count + cost, BIG), 0
        end
        if not soft then denied = true end
      elseif cost == 0 then
        AL[i], RM[i] = true, rem
      else
        AL[i], RM[i] = true, rem - cost
        cnt[key] = count + cost
      end
    end
  end
  if mode == 'r' then
    for i = 1, n do
      local rem = max(RATE[(tonumber(ARGV[a0 + 2 * i - 1]) - tonumber(ARGV[a0 + 2 * i - 1]) % 8) / 8] - cnt[keys[i]], 0)
      AL[i], RM[i] = rem >= 1, rem
    end
  elseif denied then
    -- Only kept hits are written: replayed in order on the states before
    -- the request; the other hits that were allowed report a check on the
    -- state replayed up to them (algotest.Reference).
    for key, v in pairs(first) do cnt[key] = v end
    for i = 1, n do
      local code = tonumber(ARGV[a0 + 2 * i - 1])
      local cost = tonumber(ARGV[a0 + 2 * i])
      local c, f = (code - code % 8) / 8, code % 8
      local key, rate = keys[i], RATE[c]
      local count = cnt[key]
      if f % 2 == 1 then
        AL[i], RM[i] = true, max(rate - max(count - cost, 0), 0)
        cnt[key] = max(count - cost, 0)
      elseif f >= 4 then
        local rem = max(rate - count, 0)
        if max(cost, 1) > rem then
          AL[i], RM[i] = false, rem
          if cost > 0 then cnt[key], RM[i] = min(count + cost, BIG), 0 end
        elseif cost == 0 then
          AL[i], RM[i] = true, rem
        else
          AL[i], RM[i] = true, rem - cost
          cnt[key] = count + cost
        end
      elseif AL[i] then -- a check on the state replayed so far
        local rem = max(rate - count, 0)
        AL[i], RM[i] = rem >= 1, rem
      end
    end
  end
  for i = 1, n do
    local key = keys[i]
    local from, to = first[key], cnt[key]
    if from ~= to then
      if to == 0 then
        call('DEL', key)
      elseif from == 0 then
        call('SET', key, format('%d', to), 'PX', TTL[(tonumber(ARGV[a0 + 2 * i - 1]) - tonumber(ARGV[a0 + 2 * i - 1]) % 8) / 8])
      else
        call('INCRBY', key, format('%d', to - from))
      end
      first[key] = to
    end
  end
  for i = 1, n do
    out[no + 1] = AL[i] and 1 or 0
    out[no + 2] = RM[i]
    no = no + 2
  end
end
end

-- one decides a take of one plain hit of class c: INCRBY, PEXPIRE when
-- the key was created, DECRBY (DEL when created) when it denies. A write
-- the server refuses (OOM, READONLY: before an invocation's first write)
-- still lets a denial be decided from a GET, as take.lua does; an
-- allowed hit then gets the error.
local function one(key, c, cost)
  local rate = RATE[c]
  if cost == '0' then
    local rem = max(rate - (tonumber(call('GET', key)) or 0), 0)
    out[no + 1], out[no + 2] = rem >= 1 and 1 or 0, rem
    no = no + 2
    return
  end
  local n = tonumber(cost)
  local v = redis.pcall('INCRBY', key, cost)
  if type(v) == 'table' then
    local rem = max(rate - (tonumber(call('GET', key)) or 0), 0)
    if n <= rem then error(v) end
    out[no + 1], out[no + 2] = 0, rem
    no = no + 2
    return
  end
  local rem = max(rate - (v - n), 0)
  if n > rem then
    if v == n then call('DEL', key) else call('DECRBY', key, cost) end
    out[no + 1], out[no + 2] = 0, rem
  else
    if v == n then call('PEXPIRE', key, TTL[c]) end
    out[no + 1], out[no + 2] = 1, rem - n
  end
  no = no + 2
end

for _ = 1, ns do
  local mode, n = ARGV[p], tonumber(ARGV[p + 1])
  local a0 = p + 1
  local code = tonumber(ARGV[a0 + 1])
  local stale = not OK[(code - code % 8) / 8]
  for i = 2, n do
    local ci = tonumber(ARGV[a0 + 2 * i - 1])
    if not OK[(ci - ci % 8) / 8] then stale = true end
  end
  no = no + 1
  local at = no
  if stale then
    out[at] = 1
  else
    out[at] = 0
    local ok, err
    if n == 1 and mode == 't' and code % 2 == 0 and code % 8 < 4 and #ARGV[a0 + 2] < 16 then
      ok, err = pcall(one, KEYS[k + 1], (code - code % 8) / 8, ARGV[a0 + 2])
    else
      if not general then define_general() end
      ok, err = pcall(general, mode, n, a0, k)
    end
    if not ok then
      for j = at + 1, no do out[j] = nil end
      no = at
      out[at] = type(err) == 'table' and err.err or tostring(err)
    end
  end
  k = k + n
  p = a0 + 2 * n + 1
end
return out
