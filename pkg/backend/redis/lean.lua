-- ratelimitd: sliding_window and token_bucket (GCRA) on lean keys
-- (Options.WindowKeys). Values are plain integers, so a decision needs
-- no formatted value:
--   sliding_window  one key per window, "<base>:v2s:<window_start_us>",
--                   holding the window's count; a hit reads the current
--                   and the previous window's key. INCRBY on admission
--                   (SET with a TTL of two periods when it creates the
--                   key).
--   token_bucket    "<base>:v2g" holding the TAT in µs, followed by
--                   " <frac>" only when the TAT has a fraction (frac/rate
--                   µs, exact); SET with a TTL of two capacities of time
--                   (the farthest a TAT gets ahead of now, in debt).
-- The base is wrapped in {…} when it has no hash tag (see leanKey). Every
-- value is read with one MGET per call, before any write; a request's
-- hits are decided all-or-nothing on tentative values and written only
-- when it is allowed (or for its kept hits), so a denial writes nothing.
-- The server's TIME is read once per call. The Go side decides the
-- replies from the values this script read (pkg/algo on the same state):
-- the script only decides what to write, and says whether the request
-- denied, which the Go side checks against its own decision.
--
-- KEYS   per hit, segments in order: sliding_window the current and the
--        previous window's key, token_bucket its key.
-- ARGV   now ("" for TIME), C, then per class kind ("s" sliding_window,
--        "g" token_bucket), rate, period_us, x (the window start for "s",
--        the capacity for "g"), ttl_ms; then S and per segment its mode
--        (t take, d denied, r refund) and number of hits as one argument
--        ("t1"), then per hit code (class * 8 + flags: 1 release, 2 soft,
--        4 charge) and cost; or, when every segment is a take of one hit
--        of one code and cost, without a release or a charge, "=", S,
--        code and cost.
-- Reply  an array: now_us, then per segment a status (0 decided, 1 stale
--        window, or the error text) and, when 0, whether the request
--        denied (0/1) and per hit the two integers of its state before
--        the request (sliding_window: count, previous count;
--        token_bucket: TAT µs, TAT fraction).
local ARGV, KEYS = ARGV, KEYS
local call, tonumber, floor = redis.call, tonumber, math.floor
local now
if ARGV[1] == '' then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end

-- Cost (scripts/callgrind-redis.sh; BENCHMARKS.md). Redis runs
-- the whole chunk on every call, where each table, closure and upvalue
-- is an allocation: the common request (one hit, a take) is decided
-- inline below without a closure or a pcall; the helpers and the general
-- path are created only for a call that needs them (general). tonumber
-- of a string is dear too: the usual counts ("1" class, segment, hit, a
-- cost of 1, class 0 without flags) are compared as strings.

-- idiv is exact floor division of integers (a double quotient may round
-- up to the next integer; correct it).
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- CT, the class table, 10 fields per class c from CT[10c + 1]: kind,
-- rate, ttl_ms, whether the class's window is the server's, then for a
-- sliding window the weight of the previous window at now
-- (pkg/algo/take.go swin.remaining), for a token bucket the emission interval T = Q + M/rate
-- µs (Q, M), the capacity, tau = capacity * T = TU + TF/rate µs (TU, TF);
-- then the period.
local CT = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 } -- sized for one class
local nc = ARGV[2]
if nc == '1' then nc = 1 else nc = tonumber(nc) end
local p = 3
for c = 0, nc - 1 do
  local b = 10 * c
  local kind, rate, period, x = ARGV[p], tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2]), tonumber(ARGV[p + 3])
  CT[b + 1], CT[b + 2], CT[b + 3] = kind, rate, ARGV[p + 4]
  if kind == 's' then
    CT[b + 4], CT[b + 5], CT[b + 6], CT[b + 7], CT[b + 8], CT[b + 9] =
      now - now % period == x, (x + period - now) / period, 0, 0, 0, 0
  else
    local q = idiv(period, rate)
    local m = period - q * rate
    local bm = x * m
    local bq = idiv(bm, rate)
    CT[b + 4], CT[b + 5], CT[b + 6], CT[b + 7], CT[b + 8], CT[b + 9] = true, q, m, x, x * q + bq, bm - bq * rate
  end
  CT[b + 10] = period
  p = p + 5
end
local ns = ARGV[p]
-- U: a call of S takes of one hit, all of one code and cost, without a
-- release or a charge, sends "=", S, code, cost instead of a header, code
-- and cost per segment.
local U = ns == '='
local Ucode, Ucost
if U then
  ns, Ucode, Ucost = tonumber(ARGV[p + 1]), ARGV[p + 2], ARGV[p + 3]
  p = p + 4
else
  if ns == '1' then ns = 1 else ns = tonumber(ns) end
  p = p + 1
end

-- MG: every key's value before this call, one MGET.
local nk = #KEYS
local MG
if nk <= 1000 then
  MG = call('MGET', unpack(KEYS))
else
  MG = {}
  for c0 = 1, nk, 1000 do
    local c1 = math.min(c0 + 999, nk)
    local vs = call('MGET', unpack(KEYS, c0, c1))
    for i = c0, c1 do MG[i] = vs[i - c0 + 1] end
  end
end
-- V[key], F[key]: a key's value (count or TAT, and TAT fraction) once an
-- earlier segment of this call wrote it; nil: MGET's (V is false in a
-- call of one segment).
local V, F = false, false
if ns > 1 then V, F = {}, {} end

local out, no = { now, 0, 0, 0, 0 }, 1 -- sized for one segment

-- general(mode, n, a0, k0) is the general path (created when needed).
local general

local k = 0 -- KEYS used
for _ = 1, ns do
  local h = 't1'
  if not U then h = ARGV[p] end
  local mode, n = 't', 1
  if h ~= 't1' then mode, n = string.sub(h, 1, 1), tonumber(string.sub(h, 2)) end
  local a0 = p
  local used = 0
  no = no + 1
  local at = no
  if n == 1 and mode == 't' then
    -- one hit, a take: inline unless it releases or charges
    local code, cost = Ucode, Ucost
    if not U then code, cost = ARGV[a0 + 1], ARGV[a0 + 2] end
    local f, b = 0, 0 -- flags, 10 * class
    if code ~= '0' then
      code = tonumber(code)
      f = code % 8
      b = (code - f) / 8 * 10
    end
    if CT[b + 1] == 's' then used = 2 else used = 1 end
    if not CT[b + 4] then
      out[at] = 1
    elseif f == 0 or f == 2 then -- no release, no charge
      local c = 1
      if cost ~= '1' then c = tonumber(cost) end
      local need = c
      if need < 1 then need = 1 end
      local key = KEYS[k + 1]
      local x, y
      if V then x, y = V[key], F[key] end
      if CT[b + 1] == 's' then
        if x == nil then
          x = MG[k + 1]
          if x then x = tonumber(x) else x = 0 end
        end
        local pk = KEYS[k + 2]
        y = V and V[pk]
        if y == nil or y == false then
          y = MG[k + 2]
          if y then y = tonumber(y) else y = 0 end
        end
        if not (x and y) then
          out[at] = 'ERR ratelimitd lean.lua: corrupted value of ' .. key
        else
          -- take.go slidingWindow
          local rem = floor(CT[b + 2] - (y * CT[b + 5] + x))
          local err
          if need <= rem and c > 0 then
            -- a new key: SET with its TTL (one command, not INCRBY and
            -- PEXPIRE)
            if x == 0 then
              err = redis.pcall('SET', key, cost, 'PX', CT[b + 3])
            else
              err = redis.pcall('INCRBY', key, cost)
            end
            if type(err) == 'table' and err.err then
              out[at] = err.err
            else
              err = nil
              if V then V[key], F[key] = x + c, 0 end
            end
          end
          if not err then
            out[at], out[at + 1], out[at + 2], out[at + 3] = 0, (need > rem and f ~= 2) and 1 or 0, x, y
            no = at + 3
          end
        end
      else
        if x == nil then
          x, y = MG[k + 1], 0
          if x then
            local v = x
            x = tonumber(v)
            if not x then
              local sp = string.find(v, ' ', 1, true)
              if sp then x, y = tonumber(string.sub(v, 1, sp - 1)), tonumber(string.sub(v, sp + 1)) end
            end
          else
            x = 0
          end
        end
      end
      if CT[b + 1] == 's' then
      elseif not (x and y) then
        out[at] = 'ERR ratelimitd lean.lua: corrupted value of ' .. key
      else
        -- take.go tokenBucket
        local r = CT[b + 2]
        local tat, frac = x, y
        if frac < 0 or frac >= r then tat, frac = tat + 1, 0 end
        if tat < now then tat, frac = now, 0 end
        local sUs, sFrac = CT[b + 8] - (tat - now), CT[b + 9] - frac
        if sFrac < 0 then
          sFrac = sFrac + r
          sUs = sUs - 1
        end
        local rem = 0
        if sUs >= 0 then rem = idiv(sUs * r + sFrac, CT[b + 10]) end
        local err
        if need <= rem and c > 0 then
          local nn = frac + c * CT[b + 6]
          local d = idiv(nn, r)
          tat, frac = tat + c * CT[b + 5] + d, nn - d * r
          if frac == 0 then
            err = redis.pcall('SET', key, string.format('%d', tat), 'PX', CT[b + 3])
          else
            err = redis.pcall('SET', key, string.format('%d %d', tat, frac), 'PX', CT[b + 3])
          end
          if err.err then
            out[at] = err.err
          else
            err = nil
            if V then V[key], F[key] = tat, frac end
          end
        end
        if not err then
          out[at], out[at + 1], out[at + 2], out[at + 3] = 0, (need > rem and f ~= 2) and 1 or 0, x, y
          no = at + 3
        end
      end
    else
      used = -1
    end
  else
    used = -1
  end
  if used < 0 then
    -- any other segment: the general path under pcall
    used = 0
    local stale = false
    for i = 1, n do
      local ci = tonumber(ARGV[a0 + 2 * i - 1])
      local b = (ci - ci % 8) / 8 * 10
      if not CT[b + 4] then stale = true end
      if CT[b + 1] == 's' then used = used + 2 else used = used + 1 end
    end
    if stale then
      out[at] = 1
    else
      out[at] = 0
      if not general then
        -- the general path and its helpers, created once per call
        general = (function()
          local min, max = math.min, math.max
          local BIG = 9007199254740992
          -- read returns the value of KEYS[i]: count (or TAT) and fraction; 0, 0
          -- when absent; nil when it is not one or two integers.
          local function read(i)
            local key = KEYS[i]
            local v = V and V[key]
            if v ~= nil and v ~= false then return v, F[key] end
            v = MG[i]
            if not v then return 0, 0 end
            local n = tonumber(v)
            if n then return n, 0 end
            local sp = string.find(v, ' ', 1, true)
            if sp then return tonumber(string.sub(v, 1, sp - 1)), tonumber(string.sub(v, sp + 1)) end
            return nil
          end

          -- sw_take decides a take of cost on a sliding window of class c with
          -- count curr and previous count prev (take.go slidingWindow): allowed and
          -- the new count.
          local function sw_take(c, curr, prev, cost, charge)
            local rem = max(floor(CT[10 * c + 2] - (prev * CT[10 * c + 5] + curr)), 0)
            if max(cost, 1) > rem then
              if charge and cost > 0 then return false, min(curr + cost, BIG) end
              return false, curr
            end
            return true, curr + cost
          end

          -- tb_norm is a TAT as tokenBucket starts from it: a fraction from another
          -- rate rounds the TAT up; a TAT in the past is now.
          local function tb_norm(c, tat, frac)
            if frac < 0 or frac >= CT[10 * c + 2] then tat, frac = tat + 1, 0 end
            if tat < now then tat, frac = now, 0 end
            return tat, frac
          end

          -- tb_rem is the whole tokens left at TAT (tat, frac), normalized.
          local function tb_rem(c, tat, frac)
            local r = CT[10 * c + 2]
            local sUs, sFrac = CT[10 * c + 8] - (tat - now), CT[10 * c + 9] - frac
            if sFrac < 0 then
              sFrac = sFrac + r
              sUs = sUs - 1
            end
            if sUs < 0 then return 0 end
            return idiv(sUs * r + sFrac, CT[10 * c + 10])
          end

          -- tb_add moves (tat, frac) by k * T, k >= 0 or < 0.
          local function tb_add(c, tat, frac, k)
            local r = CT[10 * c + 2]
            local n = frac + k * CT[10 * c + 6]
            local d = idiv(n, r)
            return tat + k * CT[10 * c + 5] + d, n - d * r
          end

          -- tb_take decides a take of cost on a token bucket of class c (take.go
          -- tokenBucket): allowed and the new TAT.
          local function tb_take(c, tat0, frac0, cost, charge)
            local tat, frac = tb_norm(c, tat0, frac0)
            if max(cost, 1) > tb_rem(c, tat, frac) then
              if not (charge and cost > 0) then return false, tat0, frac0 end
              -- always_charge: TAT += cost*T in at most two steps of the capacity,
              -- at most now + 2*tau, never moved back.
              local r, b = CT[10 * c + 2], CT[10 * c + 7]
              local tf2 = 2 * CT[10 * c + 9]
              local d = idiv(tf2, r)
              local bUs, bF = now + 2 * CT[10 * c + 8] + d, tf2 - d * r
              local nt, nf, left = tat, frac, cost
              for _ = 1, 2 do
                if left <= 0 then break end
                local k = min(left, b)
                left = left - k
                nt, nf = tb_add(c, nt, nf, k)
                if nt > bUs or (nt == bUs and nf > bF) then
                  nt, nf = bUs, bF
                  if tat > bUs or (tat == bUs and frac > bF) then nt, nf = tat, frac end
                  break
                end
              end
              return false, nt, nf
            end
            if cost == 0 then return true, tat0, frac0 end
            local nt, nf = tb_add(c, tat, frac, cost)
            return true, nt, nf
          end

          -- tb_credit returns n tokens (take.go creditToken): the TAT moves back by
          -- n*T in at most two steps of the capacity, never before now (0, 0: full).
          local function tb_credit(c, tat0, frac0, n)
            local tat, frac = tat0, frac0
            if frac < 0 or frac >= CT[10 * c + 2] then tat, frac = tat + 1, 0 end
            if tat < now then return tat0, frac0 end
            local b = CT[10 * c + 7]
            for _ = 1, 2 do
              if n <= 0 then break end
              local k = min(n, b)
              n = n - k
              tat, frac = tb_add(c, tat, frac, -k)
              if tat < now then break end
            end
            if tat < now or (tat == now and frac == 0) then return 0, 0 end
            return tat, frac
          end


          -- general decides a segment of any shape (several hits, repeated keys,
          -- releases, charges, modes d and r) like algotest.Reference: each hit on
          -- its key's tentative value; when a hit that is not soft denies, only
          -- the kept hits (release, charge) are replayed and written. It returns
          -- the number of KEYS it used.
          local function general(mode, n, a0, k0)
            local CL, FL, CO, KI = {}, {}, {}, {}
            local k = k0
            for i = 1, n do
              local code = tonumber(ARGV[a0 + 2 * i - 1])
              local f = code % 8
              CL[i], FL[i], CO[i], KI[i] = (code - f) / 8, f, tonumber(ARGV[a0 + 2 * i]), k
              if CT[10 * (CL[i]) + 1] == 's' then k = k + 2 else k = k + 1 end
            end
            -- T, TFR: tentative values by key; first: the value before the request.
            local T, TFR, first, firstF, order, KC = {}, {}, {}, {}, {}, {}
            local function get(i, c)
              local key = KEYS[i]
              local v = T[key]
              if v == nil then
                local a, b = read(i)
                if not (a and b) then error('ERR ratelimitd lean.lua: corrupted value of ' .. key) end
                first[key], firstF[key] = a, b
                order[#order + 1] = i
                KC[i] = c
                T[key], TFR[key] = a, b
                return a, b
              end
              return v, TFR[key]
            end
            out[no + 1] = 0
            local at = no + 1
            no = no + 1
            for i = 1, n do
              local a, b = get(KI[i] + 1, CL[i])
              if CT[10 * (CL[i]) + 1] == 's' then b = get(KI[i] + 2, CL[i]) end
              out[no + 1], out[no + 2] = a, b
              no = no + 2
            end
            -- step applies hit i to the tentative values; it returns whether it
            -- was allowed.
            local function step(i)
              local c, f, cost, kk = CL[i], FL[i], CO[i], KI[i]
              local key = KEYS[kk + 1]
              local a, b = T[key], TFR[key]
              if CT[10 * c + 1] == 's' then
                local pkey = KEYS[kk + 2]
                local prev = T[pkey]
                if f % 2 == 1 then -- release: the count, then the previous count
                  local nc2 = max(a - cost, 0)
                  T[key] = nc2
                  T[pkey] = max(prev - (cost - (a - nc2)), 0)
                  return true
                end
                local al, nv = sw_take(c, a, prev, cost, f >= 4)
                T[key] = nv
                return al
              end
              if f % 2 == 1 then
                T[key], TFR[key] = tb_credit(c, a, b, cost)
                return true
              end
              local al, nt, nf = tb_take(c, a, b, cost, f >= 4)
              T[key], TFR[key] = nt, nf
              return al
            end
            if mode == 'r' then
              -- reverse a take at its now (the keys of its window): the count less
              -- the cost, floored at 0; the TAT moved back by cost*T exactly.
              for i = n, 1, -1 do
                local c, f, cost = CL[i], FL[i], CO[i]
                if cost > 0 and f % 2 == 0 then
                  local key = KEYS[KI[i] + 1]
                  local a = T[key]
                  if CT[10 * c + 1] == 's' then
                    T[key] = max(a - cost, 0)
                  elseif a ~= 0 or TFR[key] ~= 0 then
                    T[key], TFR[key] = tb_add(c, a, TFR[key], -cost)
                  end
                end
              end
            else
              local denied = mode == 'd'
              for i = 1, n do
                if not step(i) and FL[i] % 4 < 2 then denied = true end
              end
              if denied then
                out[at] = 1
                for key, v in pairs(first) do T[key], TFR[key] = v, firstF[key] end
                for i = 1, n do
                  if FL[i] % 2 == 1 or FL[i] >= 4 then step(i) end
                end
              end
            end
            -- writes: each key whose value changed
            for _, i in ipairs(order) do
              local key = KEYS[i]
              local from, to, tf = first[key], T[key], TFR[key]
              if from ~= to or firstF[key] ~= tf then
                local c = KC[i]
                if CT[10 * c + 1] == 's' then
                  if to == 0 then
                    call('DEL', key)
                  else
                    call('INCRBY', key, string.format('%d', to - from))
                    if from == 0 then call('PEXPIRE', key, CT[10 * c + 3]) end
                  end
                else
                  local e = to
                  if tf > 0 then e = e + 1 end
                  if e <= now then
                    call('DEL', key)
                  elseif tf == 0 then
                    call('SET', key, string.format('%d', to), 'PX', CT[10 * c + 3])
                  else
                    call('SET', key, string.format('%d %d', to, tf), 'PX', CT[10 * c + 3])
                  end
                end
              end
            end
            if V then
              for _, i in ipairs(order) do
                local key = KEYS[i]
                V[key], F[key] = T[key], TFR[key]
              end
            end
            return k - k0
          end

          return general
        end)()
      end
      local ok, r = pcall(general, mode, n, a0, k)
      if not ok then
        for j = at + 1, no do out[j] = nil end
        no = at
        out[at] = type(r) == 'table' and r.err or tostring(r)
      end
    end
  end
  k = k + used
  if not U then p = a0 + 2 * n + 1 end
end
for j = no + 1, 5 do out[j] = nil end
return out
