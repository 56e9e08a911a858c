-- ratelimitd: fixed_window with the window in the key (Options.WindowKeys).
-- A key is "<base>:v2:<window_start_us>" (the base wrapped in {…} when it
-- has no hash tag, so the key hashes like the base), its value a plain
-- integer count, its TTL set when the key is created. The Go side names
-- each key's window from its estimate of the server's clock. When it asks
-- (ARGV[1] is ""), the script reads TIME once and refuses a segment of a
-- class whose window is not the server's current one (nothing written, Go
-- sends it again with the server's now); otherwise (ARGV[1] is "-") it
-- reads no clock and counts in the windows the keys name.
--
-- KEYS   one key per hit, segments in order.
-- ARGV   "" or "-", C, then per class rate period_us ws ttl_ms, then per
--        hit code and cost. code is class * 64 + flags: 1 release,
--        2 soft, 4 charge, 8 the hit continues the previous hit's segment,
--        16 the segment is a take that another slot group denied, 32 a
--        refund. A segment's mode is on its first hit.
-- Reply  an array: now_us (0 without TIME), then per segment either one
--        integer per hit, remaining * 2 + allowed (0/1), or -1 (stale
--        window: nothing written), or the segment's error text.
local ARGV, KEYS = ARGV, KEYS
local call, rpcall, tonumber = redis.call, redis.pcall, tonumber
local BIG = 9007199254740992
local check = ARGV[1] == ''
local now = 0
if check then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local nc = tonumber(ARGV[2])
local RATE, TTL, OK = {}, {}, {}
local p = 3
for c = 0, nc - 1 do
  RATE[c], TTL[c] = tonumber(ARGV[p]), ARGV[p + 3]
  if check then
    local period = tonumber(ARGV[p + 1])
    OK[c] = now - now % period == tonumber(ARGV[p + 2])
  end
  p = p + 4
end
local out, no = { now }, 1
local nk = #KEYS

-- general decides a segment of any shape (hits i..j, codes from ARGV[a])
-- exactly like pkg/algo's fixedWindow over tentative counts (a repeated
-- key sees its earlier hits), all-or-nothing: reads first, then writes
-- the difference per key.
local general
local function define_general()
  local min, max, format = math.min, math.max, string.format
  general = function(mode, i, j, a)
    local n = j - i + 1
    local cnt, first, keys, CL, FL, CO = {}, {}, {}, {}, {}, {}
    for h = 1, n do
      local key = KEYS[i + h - 1]
      keys[h] = key
      local code = tonumber(ARGV[a + 2 * h - 2])
      CO[h] = tonumber(ARGV[a + 2 * h - 1])
      CL[h], FL[h] = (code - code % 64) / 64, code % 8
      if first[key] == nil then
        first[key] = tonumber(call('GET', key)) or 0
        cnt[key] = first[key]
      end
    end
    local AL, RM, denied = {}, {}, mode == 'd'
    for h = 1, n do
      local f, cost = FL[h], CO[h]
      local rel, soft, charge = f % 2 == 1, f % 4 >= 2, f >= 4
      local key, rate = keys[h], RATE[CL[h]]
      local count = cnt[key]
      if mode == 'r' then
        -- reverse a take: its window is the key's; a count already gone
        -- stays gone.
        if cost > 0 and count > 0 then cnt[key] = max(count - cost, 0) end
      elseif rel then
        AL[h], RM[h] = true, max(rate - max(count - cost, 0), 0)
        cnt[key] = max(count - cost, 0)
      else
        local rem = max(rate - count, 0)
        if max(cost, 1) > rem then
          AL[h], RM[h] = false, rem
          if charge and cost > 0 then
            cnt[key], RM[h] = min(count + cost, BIG), 0
          end
          if not soft then denied = true end
        elseif cost == 0 then
          AL[h], RM[h] = true, rem
        else
          AL[h], RM[h] = true, rem - cost
          cnt[key] = count + cost
        end
      end
    end
    if mode == 'r' then
      for h = 1, n do
        local rem = max(RATE[CL[h]] - cnt[keys[h]], 0)
        AL[h], RM[h] = rem >= 1, rem
      end
    elseif denied then
      -- Only kept hits are written: replayed in order on the states before
      -- the request; the other hits that were allowed report a check on the
      -- state replayed up to them (algotest.Reference).
      for key, v in pairs(first) do cnt[key] = v end
      for h = 1, n do
        local f, cost = FL[h], CO[h]
        local key, rate = keys[h], RATE[CL[h]]
        local count = cnt[key]
        if f % 2 == 1 then
          AL[h], RM[h] = true, max(rate - max(count - cost, 0), 0)
          cnt[key] = max(count - cost, 0)
        elseif f >= 4 then
          local rem = max(rate - count, 0)
          if max(cost, 1) > rem then
            AL[h], RM[h] = false, rem
            if cost > 0 then cnt[key], RM[h] = min(count + cost, BIG), 0 end
          elseif cost == 0 then
            AL[h], RM[h] = true, rem
          else
            AL[h], RM[h] = true, rem - cost
            cnt[key] = count + cost
          end
        elseif AL[h] then -- a check on the state replayed so far
          local rem = max(rate - count, 0)
          AL[h], RM[h] = rem >= 1, rem
        end
      end
    end
    for h = 1, n do
      local key = keys[h]
      local from, to = first[key], cnt[key]
      if from ~= to then
        if to == 0 then
          call('DEL', key)
        elseif from == 0 then
          call('SET', key, format('%d', to), 'PX', TTL[CL[h]])
        else
          call('INCRBY', key, format('%d', to - from))
        end
        first[key] = to
      end
    end
    for h = 1, n do
      out[no + h] = RM[h] * 2 + (AL[h] and 1 or 0)
    end
    no = no + n
  end
end

-- undo reverses hits i..h of a lean segment whose INCRBY replies are in V
-- (false: not charged): DEL a key the hit created, else DECRBY its cost.
local function undo(V, i, h, a)
  for x = h, i, -1 do
    local v = V[x]
    if v then
      local cost = ARGV[a + 2 * (x - i) + 1]
      if v == tonumber(cost) then call('DEL', KEYS[x]) else call('DECRBY', KEYS[x], cost) end
    end
  end
end

-- lean decides a take of hits i..j on distinct keys without a release or
-- a charge: INCRBY each hit's cost (GET for a check), and when a hit that
-- is not soft is over, undo them all; a soft hit that is over undoes
-- itself only. PEXPIRE gives a key its TTL when the request created it
-- and is kept. It returns false, having undone what it wrote, when a
-- write is refused (OOM, READONLY, WRONGTYPE): general then decides the
-- segment from reads and raises the error only for a write it keeps.
local function lean(i, j, a)
  local V, R = {}, {}
  local denied = false
  for h = i, j do
    local x = a + 2 * (h - i)
    local code, cost = tonumber(ARGV[x]), ARGV[x + 1]
    local rate = RATE[(code - code % 64) / 64]
    local key = KEYS[h]
    local rem
    if cost == '0' then
      local v = rpcall('GET', key)
      if type(v) == 'table' then undo(V, i, h - 1, a) return false end
      rem, V[h] = rate - (tonumber(v) or 0), false
      if rem < 1 then
        if code % 4 < 2 then denied = true end
        rem = 0
      end
      out[no + h - i + 1] = rem * 2 + (rem >= 1 and 1 or 0)
    else
      local v = rpcall('INCRBY', key, cost)
      if type(v) == 'table' then undo(V, i, h - 1, a) return false end
      local n = tonumber(cost)
      V[h] = v
      rem = rate - (v - n)
      if rem < 0 then rem = 0 end
      if n > rem then
        if code % 4 >= 2 then -- soft: only this hit is undone
          if v == n then call('DEL', key) else call('DECRBY', key, cost) end
          V[h] = false
        else
          denied = true
        end
        out[no + h - i + 1] = rem * 2
      else
        out[no + h - i + 1] = (rem - n) * 2 + 1
      end
    end
    R[h] = rem
  end
  if denied then
    undo(V, i, j, a)
    -- The hits that were not over report a check on the state before.
    for h = i, j do
      local o = no + h - i + 1
      if out[o] % 2 == 1 then out[o] = R[h] * 2 + 1 end
    end
  else
    for h = i, j do
      local v = V[h]
      if v and v == tonumber(ARGV[a + 2 * (h - i) + 1]) then
        local code = tonumber(ARGV[a + 2 * (h - i)])
        call('PEXPIRE', KEYS[h], TTL[(code - code % 64) / 64])
      end
    end
  end
  no = no + j - i + 1
  return true
end

-- one is lean for a single hit: INCRBY, PEXPIRE when the key was created,
-- DECRBY (DEL when created) when it is over.
local function one(key, rate, ttl, cost)
  local v = rpcall('INCRBY', key, cost)
  if type(v) == 'table' then return false end
  local n = tonumber(cost)
  local rem = rate - (v - n)
  if rem < 0 then rem = 0 end
  if n > rem then
    if v == n then call('DEL', key) else call('DECRBY', key, cost) end
    out[no + 1] = rem * 2
  else
    if v == n then call('PEXPIRE', key, ttl) end
    out[no + 1] = (rem - n) * 2 + 1
  end
  no = no + 1
  return true
end

local i = 1
while i <= nk do
  local a = p + 2 * (i - 1)
  local code = tonumber(ARGV[a])
  local f = code % 64
  local mode = f >= 32 and 'r' or (f >= 16 and 'd' or 't')
  local cls = (code - f) / 64
  local j = i
  local plain = mode == 't' and f % 8 < 4 and f % 2 == 0 and #ARGV[a + 1] < 16
  local stale = check and not OK[cls]
  while j < nk do
    local cj = tonumber(ARGV[a + 2 * (j - i + 1)])
    local fj = cj % 64
    if fj % 16 < 8 then break end
    j = j + 1
    if fj % 8 >= 4 or fj % 2 == 1 or #ARGV[a + 2 * (j - i) + 1] >= 16 then plain = false end
    if check and not OK[(cj - fj) / 64] then stale = true end
  end
  if stale then
    no = no + 1
    out[no] = -1
  else
    local at = no
    local ok, err = true, nil
    local done = false
    if plain and i == j and ARGV[a + 1] ~= '0' then
      done = one(KEYS[i], RATE[cls], TTL[cls], ARGV[a + 1])
    elseif plain and j - i < 16 then
      -- lean needs distinct keys: a repeated key sees its earlier hits.
      for x = i + 1, j do
        for y = i, x - 1 do
          if KEYS[x] == KEYS[y] then plain = false end
        end
      end
      if plain then
        ok, err = pcall(lean, i, j, a)
        done = ok and err
        if not ok then done = true end
      end
    end
    if not done then
      if not general then define_general() end
      ok, err = pcall(general, mode, i, j, a)
    end
    if not ok then
      for x = at + 1, no do out[x] = nil end
      no = at + 1
      out[no] = type(err) == 'table' and err.err or tostring(err)
    end
  end
  i = j + 1
end
return out
