-- ratelimitd: sliding_window and token_bucket (GCRA) on lean keys
-- (Options.WindowKeys). Values are plain integers, so a decision needs
-- no formatted value:
--   sliding_window  one key per window, "<base>:v2s:<window_start_us>",
--                   holding the window's count; a hit reads the current
--                   and the previous window's key. INCRBY on admission,
--                   PEXPIRE of two periods when the key is created.
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
--        the capacity for "g"), ttl_ms; then S and per segment mode (t
--        take, d denied, r refund), n, then per hit code (class * 8 +
--        flags: 1 release, 2 soft, 4 charge) and cost.
-- Reply  an array: now_us, then per segment a status (0 decided, 1 stale
--        window, or the error text) and, when 0, whether the request
--        denied (0/1) and per hit the two integers of its state before
--        the request (sliding_window: count, previous count;
--        token_bucket: TAT µs, TAT fraction).
local ARGV, KEYS = ARGV, KEYS
local call, tonumber, floor, min, max = redis.call, tonumber, math.floor, math.min, math.max
local BIG = 9007199254740992
local now
if ARGV[1] == '' then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end

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

-- The class table: per class its kind, rate and TTL; sliding_window the
-- weight of the previous window at now (take.go swin.remaining);
-- token_bucket the emission interval T = Q + M/rate µs, the capacity and
-- tau = capacity * T = TU + TF/rate µs.
local nc = tonumber(ARGV[2])
local KIND, RATE, TTL, OK, W, Q, M, CAP, TU, TF, PER = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
local p = 3
for c = 0, nc - 1 do
  local kind, rate, period, x = ARGV[p], tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2]), tonumber(ARGV[p + 3])
  KIND[c], RATE[c], TTL[c], PER[c] = kind, rate, ARGV[p + 4], period
  if kind == 's' then
    OK[c] = now - now % period == x
    W[c] = (x + period - now) / period
  else
    OK[c] = true
    local q = idiv(period, rate)
    local m = period - q * rate
    Q[c], M[c], CAP[c] = q, m, x
    local bm = x * m
    local bq = idiv(bm, rate)
    TU[c], TF[c] = x * q + bq, bm - bq * rate
  end
  p = p + 5
end
local ns = tonumber(ARGV[p])
p = p + 1

-- Every key's value before this call, one MGET.
local nk = #KEYS
local MG = {}
for c0 = 1, nk, 1000 do
  local c1 = min(c0 + 999, nk)
  local vs = call('MGET', unpack(KEYS, c0, c1))
  for i = c0, c1 do MG[i] = vs[i - c0 + 1] end
end
-- V[key], F[key]: a key's value (count or TAT, and TAT fraction) once an
-- earlier segment of this call wrote it; nil: MGET's.
local V, F = {}, {}

-- read returns the value of KEYS[i]: count (or TAT) and fraction; 0, 0
-- when absent.
local function read(i)
  local key = KEYS[i]
  local v = V[key]
  if v ~= nil then return v, F[key] end
  v = MG[i]
  if not v then return 0, 0 end
  local n = tonumber(v)
  if n then return n, 0 end
  local sp = string.find(v, ' ', 1, true)
  local a, b
  if sp then a, b = tonumber(string.sub(v, 1, sp - 1)), tonumber(string.sub(v, sp + 1)) end
  if not (a and b) then error('ERR ratelimitd lean.lua: corrupted value of ' .. key) end
  return a, b
end

-- sw_take decides a take of cost on a sliding window of class c with
-- count curr and previous count prev (take.go slidingWindow): allowed and
-- the new count.
local function sw_take(c, curr, prev, cost, charge)
  local rem = max(floor(RATE[c] - (prev * W[c] + curr)), 0)
  if max(cost, 1) > rem then
    if charge and cost > 0 then return false, min(curr + cost, BIG) end
    return false, curr
  end
  return true, curr + cost
end

-- tb_norm is a TAT as tokenBucket starts from it: a fraction from another
-- rate rounds the TAT up; a TAT in the past is now.
local function tb_norm(c, tat, frac)
  if frac < 0 or frac >= RATE[c] then tat, frac = tat + 1, 0 end
  if tat < now then tat, frac = now, 0 end
  return tat, frac
end

-- tb_rem is the whole tokens left at TAT (tat, frac), normalized.
local function tb_rem(c, tat, frac)
  local r = RATE[c]
  local sUs, sFrac = TU[c] - (tat - now), TF[c] - frac
  if sFrac < 0 then
    sFrac = sFrac + r
    sUs = sUs - 1
  end
  if sUs < 0 then return 0 end
  return idiv(sUs * r + sFrac, PER[c])
end

-- tb_add moves (tat, frac) by k * T, k >= 0 or < 0.
local function tb_add(c, tat, frac, k)
  local r = RATE[c]
  local n = frac + k * M[c]
  local d = idiv(n, r)
  return tat + k * Q[c] + d, n - d * r
end

-- tb_take decides a take of cost on a token bucket of class c (take.go
-- tokenBucket): allowed and the new TAT.
local function tb_take(c, tat0, frac0, cost, charge)
  local tat, frac = tb_norm(c, tat0, frac0)
  if max(cost, 1) > tb_rem(c, tat, frac) then
    if not (charge and cost > 0) then return false, tat0, frac0 end
    -- always_charge: TAT += cost*T in at most two steps of the capacity,
    -- at most now + 2*tau, never moved back.
    local r, b = RATE[c], CAP[c]
    local tf2 = 2 * TF[c]
    local d = idiv(tf2, r)
    local bUs, bF = now + 2 * TU[c] + d, tf2 - d * r
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
  if frac < 0 or frac >= RATE[c] then tat, frac = tat + 1, 0 end
  if tat < now then return tat0, frac0 end
  local b = CAP[c]
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

local out, no = { now }, 1

-- one decides a take of one hit without a release or a charge (the
-- common request) on KEYS[k + 1] (and k + 2), and appends whether it
-- denied the request and the value it read. It returns the number of KEYS
-- it used.
local function one(c, k, cost, soft)
  local n = tonumber(cost)
  if KIND[c] == 's' then
    local curr = read(k + 1)
    local prev = read(k + 2)
    local al, nv = sw_take(c, curr, prev, n, false)
    out[no + 1], out[no + 2], out[no + 3] = (al or soft) and 0 or 1, curr, prev
    no = no + 3
    if al and n > 0 then
      local key = KEYS[k + 1]
      call('INCRBY', key, cost)
      if curr == 0 then call('PEXPIRE', key, TTL[c]) end
      V[key], F[key] = nv, 0
    end
    return 2
  end
  local tat, frac = read(k + 1)
  local al, nt, nf = tb_take(c, tat, frac, n, false)
  out[no + 1], out[no + 2], out[no + 3] = (al or soft) and 0 or 1, tat, frac
  no = no + 3
  if al and n > 0 then
    local key = KEYS[k + 1]
    if nf == 0 then
      call('SET', key, string.format('%d', nt), 'PX', TTL[c])
    else
      call('SET', key, string.format('%d %d', nt, nf), 'PX', TTL[c])
    end
    V[key], F[key] = nt, nf
  end
  return 1
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
    if KIND[CL[i]] == 's' then k = k + 2 else k = k + 1 end
  end
  -- T, TF: tentative values by key; first: the value before the request.
  local T, TF, first, firstF, order, KC = {}, {}, {}, {}, {}, {}
  local function get(i, c)
    local key = KEYS[i]
    local v = T[key]
    if v == nil then
      local a, b = read(i)
      first[key], firstF[key] = a, b
      order[#order + 1] = i
      KC[i] = c
      T[key], TF[key] = a, b
      return a, b
    end
    return v, TF[key]
  end
  out[no + 1] = 0
  local at = no + 1
  no = no + 1
  for i = 1, n do
    local a, b = get(KI[i] + 1, CL[i])
    if KIND[CL[i]] == 's' then b = get(KI[i] + 2, CL[i]) end
    out[no + 1], out[no + 2] = a, b
    no = no + 2
  end
  -- step applies hit i to the tentative values; it returns whether it
  -- was allowed.
  local function step(i)
    local c, f, cost, kk = CL[i], FL[i], CO[i], KI[i]
    local key = KEYS[kk + 1]
    local a, b = T[key], TF[key]
    if KIND[c] == 's' then
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
      T[key], TF[key] = tb_credit(c, a, b, cost)
      return true
    end
    local al, nt, nf = tb_take(c, a, b, cost, f >= 4)
    T[key], TF[key] = nt, nf
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
        if KIND[c] == 's' then
          T[key] = max(a - cost, 0)
        elseif a ~= 0 or TF[key] ~= 0 then
          T[key], TF[key] = tb_add(c, a, TF[key], -cost)
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
      for key, v in pairs(first) do T[key], TF[key] = v, firstF[key] end
      for i = 1, n do
        if FL[i] % 2 == 1 or FL[i] >= 4 then step(i) end
      end
    end
  end
  -- writes: each key whose value changed
  for _, i in ipairs(order) do
    local key = KEYS[i]
    local from, to, tf = first[key], T[key], TF[key]
    if from ~= to or firstF[key] ~= tf then
      local c = KC[i]
      if KIND[c] == 's' then
        if to == 0 then
          call('DEL', key)
        else
          call('INCRBY', key, string.format('%d', to - from))
          if from == 0 then call('PEXPIRE', key, TTL[c]) end
        end
      else
        local e = to
        if tf > 0 then e = e + 1 end
        if e <= now then
          call('DEL', key)
        elseif tf == 0 then
          call('SET', key, string.format('%d', to), 'PX', TTL[c])
        else
          call('SET', key, string.format('%d %d', to, tf), 'PX', TTL[c])
        end
      end
    end
  end
  for _, i in ipairs(order) do
    local key = KEYS[i]
    V[key], F[key] = T[key], TF[key]
  end
  return k - k0
end

local k = 0 -- KEYS used
for _ = 1, ns do
  local mode, n = ARGV[p], tonumber(ARGV[p + 1])
  local a0 = p + 1
  local stale = false
  local code = tonumber(ARGV[a0 + 1])
  local c1 = (code - code % 8) / 8
  for i = 1, n do
    local ci = tonumber(ARGV[a0 + 2 * i - 1])
    if not OK[(ci - ci % 8) / 8] then stale = true end
  end
  no = no + 1
  local at = no
  local used = 0
  if stale then
    out[at] = 1
    for i = 1, n do
      local ci = tonumber(ARGV[a0 + 2 * i - 1])
      if KIND[(ci - ci % 8) / 8] == 's' then used = used + 2 else used = used + 1 end
    end
  else
    out[at] = 0
    local ok, r
    if n == 1 and mode == 't' and code % 2 == 0 and code % 8 < 4 then
      ok, r = pcall(one, c1, k, ARGV[a0 + 2], code % 8 >= 2)
    else
      ok, r = pcall(general, mode, n, a0, k)
    end
    if ok then
      used = r
    else
      for j = at + 1, no do out[j] = nil end
      no = at
      out[at] = type(r) == 'table' and r.err or tostring(r)
      for i = 1, n do
        local ci = tonumber(ARGV[a0 + 2 * i - 1])
        if KIND[(ci - ci % 8) / 8] == 's' then used = used + 2 else used = used + 1 end
      end
    end
  end
  k = k + used
  p = a0 + 2 * n + 1
end
return out
