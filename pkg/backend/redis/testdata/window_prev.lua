-- ratelimitd: fixed_window with the window in the key (Options.WindowKeys).
-- A key is "<base>:v2:<window_start_us>" (the base wrapped in {…} when it
-- has no hash tag, so the key hashes like the base), its value a plain
-- integer count, its TTL set when the key is created. The Go side names
-- each key's window from its estimate of the server's clock. When it asks
-- (a negative class count), the script reads TIME once and refuses a
-- segment of a class whose window is not the server's current one
-- (nothing written, Go sends it again with the server's now); otherwise
-- it reads no clock and counts in the windows the keys name.
--
-- KEYS   one key per hit, segments in order.
-- ARGV   one of three layouts, told apart by #ARGV:
--        rate ttl_ms: one class, every segment a take of one hit costing 1
--          (#ARGV == 2);
--        rate ttl_ms cost...: the same with a cost per hit (2 + #KEYS);
--        C (-C: check the windows), then per class rate ttl_ms (and with
--          -C period_us ws), then per hit code and cost. code is class * 64
--          + flags: 1 release, 2 soft, 4 charge, 8 the next hit belongs to
--          the same segment, 16 the segment is a take that another slot
--          group denied, 32 a refund (the mode is on a segment's hits).
-- Reply  per segment either one integer per hit, remaining * 2 + allowed
--        (0/1), or -1 (stale window: nothing written), or the segment's
--        error text; in the third layout after now_us (0 without TIME).
--        The first two layouts answer one decision as a plain integer.
if #KEYS == 1 and #ARGV < 4 then
  -- One decision in a short layout (a request alone, the usual call at
  -- low load): the direct path below without its locals, loop and reply
  -- table, which cost a lone decision more than its INCRBY.
  local key, cost, rate = KEYS[1], ARGV[3] or '1', tonumber(ARGV[1])
  local n = cost == '1' and 1 or tonumber(cost)
  local v = redis.pcall('INCRBY', key, cost)
  if type(v) == 'number' then
    local rem = rate - v + n
    if rem < 0 then rem = 0 end
    if n > rem then
      if v == n then redis.call('DEL', key) else redis.call('DECRBY', key, cost) end
      return rem * 2
    end
    if v == n then redis.call('PEXPIRE', key, ARGV[2]) end
    return (rem - n) * 2 + 1
  end
  local g = redis.pcall('GET', key)
  if type(g) == 'table' then return { g.err } end
  local rem = rate - (tonumber(g) or 0)
  if rem < 0 then rem = 0 end
  if n > rem then return rem * 2 end
  return { v.err }
end
local ARGV, KEYS = ARGV, KEYS
local call, rpcall, tonumber = redis.call, redis.pcall, tonumber
local BIG = 9007199254740992
local nk = #KEYS
local na = #ARGV
if na == 2 or na == 2 + nk then
  -- A take of one hit per segment, one class: INCRBY, PEXPIRE when the
  -- key was created, DECRBY (DEL when created) when it is over. A refused
  -- INCRBY (OOM, READONLY) still decides a denial from a GET.
  local rate, ttl, costs = tonumber(ARGV[1]), ARGV[2], na > 2
  local out = {}
  for i = 1, nk do
    local key, cost, n = KEYS[i], '1', 1
    if costs then
      cost = ARGV[2 + i]
      n = tonumber(cost)
    end
    local v = rpcall('INCRBY', key, cost)
    if type(v) == 'number' then
      local rem = rate - v + n
      if rem < 0 then rem = 0 end
      if n > rem then
        if v == n then call('DEL', key) else call('DECRBY', key, cost) end
        out[i] = rem * 2
      else
        if v == n then call('PEXPIRE', key, ttl) end
        out[i] = (rem - n) * 2 + 1
      end
    else
      local g = rpcall('GET', key)
      if type(g) == 'table' then
        out[i] = g.err
      else
        local rem = rate - (tonumber(g) or 0)
        if rem < 0 then rem = 0 end
        out[i] = n > rem and rem * 2 or v.err
      end
    end
  end
  if nk == 1 and type(out[1]) == 'number' then return out[1] end
  return out
end
local nc = tonumber(ARGV[1])
local check = nc < 0
local now = 0
-- RATE[c] is class c's rate; its TTL is ARGV[TTL + w * c], a string.
local RATE, OK = {}, nil
local w, p = 2, 2
if check then
  nc, w = -nc, 4
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  OK = {}
end
local TTL = 3 - w
for c = 1, nc do
  RATE[c] = tonumber(ARGV[p])
  if check then
    local period = tonumber(ARGV[p + 2])
    OK[c] = now - now % period == tonumber(ARGV[p + 3])
  end
  p = p + w
end
local out, no = { now }, 1

local slow -- the path of the other segments, defined on first use

-- The direct path, a take of one hit without a release or a charge:
-- INCRBY, PEXPIRE when the key was created, DECRBY (DEL when created)
-- when it is over. Everything else, and a refused INCRBY, goes to slow.
local i = 1
while i <= nk do
  local a = p + 2 * i - 2
  local cs, cost = ARGV[a], ARGV[a + 1]
  local done = false
  if (cs == '0' or cs == '2') and cost ~= '0' and #cost < 16 and not (check and not OK[1]) then
    local key = KEYS[i]
    local v = rpcall('INCRBY', key, cost)
    if type(v) == 'number' then
      local n = cost == '1' and 1 or tonumber(cost)
      local rem = RATE[1] - v + n
      if rem < 0 then rem = 0 end
      no = no + 1
      if n > rem then
        if v == n then call('DEL', key) else call('DECRBY', key, cost) end
        out[no] = rem * 2
      else
        if v == n then call('PEXPIRE', key, ARGV[TTL + w]) end
        out[no] = (rem - n) * 2 + 1
      end
      i = i + 1
      done = true
    end
  end
  if not done then
    local code = tonumber(cs)
    local f = code % 64
    local c = (code - f) / 64 + 1
    local mode = f >= 32 and 'r' or (f >= 16 and 'd' or 't')
    local plain = mode == 't' and f % 8 < 4 and f % 2 == 0 and #cost < 16
    local stale = check and not OK[c]
    local j = i
    while f % 16 >= 8 and j < nk do
      j = j + 1
      local cj = tonumber(ARGV[a + 2 * (j - i)])
      f = cj % 64
      if f % 8 >= 4 or f % 2 == 1 or #ARGV[a + 2 * (j - i) + 1] >= 16 then plain = false end
      if check and not OK[(cj - f) / 64 + 1] then stale = true end
    end
    local at = no
    if stale then
      no = no + 1
      out[no] = -1
    else
      if not slow then
        -- Function literals here, not at the top: a closure costs every
        -- invocation that creates it, and the direct path needs none.
        slow = (function()
          local min, max, format = math.min, math.max, string.format
          -- general decides a segment of any shape (hits i..j, codes from ARGV[a])
          -- exactly like pkg/algo's fixedWindow over tentative counts (a repeated
          -- key sees its earlier hits), all-or-nothing: reads first, then writes
          -- the difference per key.
          local function general(mode, i, j, a)
            local n = j - i + 1
            local cnt, first, keys, CL, FL, CO = {}, {}, {}, {}, {}, {}
            for h = 1, n do
              local key = KEYS[i + h - 1]
              keys[h] = key
              local code = tonumber(ARGV[a + 2 * h - 2])
              CO[h] = tonumber(ARGV[a + 2 * h - 1])
              CL[h], FL[h] = (code - code % 64) / 64 + 1, code % 8
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
                  call('SET', key, format('%d', to), 'PX', ARGV[TTL + w * CL[h]])
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
              local rate = RATE[(code - code % 64) / 64 + 1]
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
                  call('PEXPIRE', KEYS[h], ARGV[TTL + w * ((code - code % 64) / 64 + 1)])
                end
              end
            end
            no = no + j - i + 1
            return true
          end

          -- slow decides segment i..j (codes from ARGV[a]) of any shape: lean for a
          -- take on distinct keys without releases or charges, else general.
          return function(mode, i, j, a, plain)
            if plain and j - i < 16 then
              -- lean needs distinct keys: a repeated key sees its earlier hits.
              for x = i + 1, j do
                for y = i, x - 1 do
                  if KEYS[x] == KEYS[y] then plain = false end
                end
              end
              if plain then
                local ok, done = pcall(lean, i, j, a)
                if not ok then error(done) end
                if done then return end
              end
            end
            general(mode, i, j, a)
          end
        end)()
      end
      local ok, err = pcall(slow, mode, i, j, a, plain)
      if not ok then
        for x = at + 1, no do out[x] = nil end
        no = at + 1
        out[no] = type(err) == 'table' and err.err or tostring(err)
      end
    end
    i = j + 1
  end
end
return out
