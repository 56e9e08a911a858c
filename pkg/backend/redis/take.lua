-- ratelimitd: decide a batch of requests ("segments") in one invocation.
-- Each segment is the hits of one request (or of one Cluster slot group of
-- a request), decided atomically and all-or-nothing exactly as if it were
-- the only one; segments run in order, so a later segment sees an earlier
-- one's writes. A line-by-line port of pkg/algo (take.go, calendar.go); see
-- docs/redis.md for the protocol.
--
-- KEYS     the state keys of every hit of every segment, in order. One key
--          per hit and never a derived key: every key the script touches is
--          declared, so Cluster slot routing is exact (a Cluster batch only
--          holds segments of one slot).
-- ARGV[1]  S, the number of segments (>= 1). Then per segment:
--   mode   "t" take, "r" refund (reverse a previous take exactly and reply
--          with check-only decisions on the restored state).
--   now    integer microseconds since the Unix epoch, or "" for the
--          server's TIME (read once per invocation). Tests pin it; refunds
--          pass the take's now.
--   nonce  request nonce: makes log members unique across requests.
--   n      number of hits of the segment (>= 0), followed by n × NF fields:
--          kind, rate, period_us, burst, calendar, multiplier, cost, flags
--          (a sum of 1 = release: return cost units, algo.Release; 2 =
--          soft: a denial does not deny the request; 4 = charge: the
--          always_charge counting policy, algo.Charge). cost is at most
--          2^53 (algo.MaxCost, above every limit's capacity: always
--          denied). A release or charge hit is kept when its segment is
--          denied (algo.Hit.Kept; see algotest.Reference).
--
-- Reply: one bulk string, one line per segment, lines joined by "\n":
--   "<now_us> then per hit: <allowed 0/1> <remaining> <retry_us>
--    <reset_us> <window_us>" (integers separated by one space), or
--   "!<error>" when that segment failed (nothing of it was written; see
--          Errors). Durations are integer microseconds.
--
-- Errors. A malformed ARGV/KEYS layout (segment count, a segment header,
-- the number of KEYS or ARGV) fails the whole invocation before anything
-- is read or written. A segment whose now or hit fields are out of range
-- (an integer outside its bounds; a cost outside [-2^53, 2^53]) is
-- rejected on its own: its line is "!ERR ratelimitd take.lua: invalid
-- segment: <field> of hit <i>" (or "...: now"), nothing of it is read or
-- written, and the other segments are decided. Each segment runs under
-- pcall in two phases: (1) reads and decisions, no write; (2) writes, only
-- when it allowed. An error in phase 1 (e.g. WRONGTYPE, a corrupted value) becomes
-- that segment's "!" line and nothing of it is written. In phase 2 the
-- only errors Redis can raise are write refusals (OOM under noeviction,
-- READONLY, MISCONF, NOREPLICAS), and Redis raises those only before the
-- first write of an invocation (a script that already wrote is never
-- failed on server state): such a segment wrote nothing either. Redis does
-- not roll scripts back, so this split is what keeps a failing segment
-- from leaving partial writes or affecting the others.
--
-- Values (all instants in µs since the epoch):
--   fixed_window    string "<window_start> <count>"
--   sliding_window  string "<window_start> <count> <prev_count>"
--   token_bucket    string "<tat_us> <tat_frac>" (TAT = tat_us + frac/rate)
--   sliding_log,
--   concurrency     sorted set, score = timestamp, member = nonce.hit.unit
-- Every write sets a TTL equal to the time until the state is empty again
-- (algo.ExpiresAtUs - now); an empty state deletes the key.
--
-- Numbers are Lua doubles; pkg/algo keeps every integer below 2^53 and
-- uses only +, -, *, floor division and the same float operations in the
-- same order, so results are bit-identical.

-- Cost (docs/redis.md "Script cost"). Most of a segment's time in Redis
-- is its redis.calls; the Lua around them is kept small: the string kinds
-- (fixed_window, sliding_window, token_bucket) keep their state as plain
-- numbers, not tables; a take segment of string kinds on distinct keys
-- (the common case) runs a direct path without per-hit decision tables;
-- the values of every string key of the invocation are read with one MGET
-- up front (a key MGET reports missing is confirmed absent with one
-- EXISTS, or read with its own GET, so a wrong-type key still fails its
-- own segment with WRONGTYPE); a value this script wrote is remembered,
-- so a later segment reads it without a call. Numbers are formatted with
-- string.format('%d') wherever they are stored or replied (tostring's
-- %.14g differs above 10^14).

local NF = 8 -- fields per hit
local NS = 4 -- header fields per segment

local floor = math.floor
local max = math.max
local min = math.min
local tonumber = tonumber
local format = string.format
local find = string.find
local sub = string.sub
local concat = table.concat
local call = redis.call
local pcall = pcall
local unpack = unpack
local ARGV = ARGV
local KEYS = KEYS

local BIG = 9007199254740992 -- 2^53

-- FLAGS maps a hit's flags field to its number (1 release, 2 soft, 4 charge).
local FLAGS = { ['0'] = 0, ['1'] = 1, ['2'] = 2, ['3'] = 3, ['4'] = 4, ['5'] = 5, ['6'] = 6, ['7'] = 7 }

-- Parse and validate every segment before anything runs. Functions below
-- are defined once per invocation, and only for the kinds it uses.
local used = {}
local anycal = false
local segs = {}
local needtime = false
local anyslow = false -- a segment not seg.fast
local skeys, nskeys = {}, 0 -- keys of string-kind hits, for the MGET
do
  local bad = function(what)
    return redis.error_reply('ERR ratelimitd take.lua: malformed arguments: ' .. what)
  end
  -- x % 1 == 0 is false for nil-free non-integers, inf and nan
  local function int(x, lo, hi) return x and x % 1 == 0 and x >= lo and x <= hi end
  -- hit_problem names the first field of a hit outside its range, or nil.
  -- cost may be up to 2^53 (algo.MaxCost: every limit denies it).
  local function hit_problem(kind, rate, period, burst, cal, mult, cost, flags)
    if not int(kind, 0, 4) then return 'kind' end
    if not int(rate, 1 - BIG, BIG - 1) then return 'rate' end
    if not int(period, 1, BIG - 1) then return 'period' end
    if not int(burst, 1 - BIG, BIG - 1) then return 'burst' end
    if not int(cal, 0, 2) then return 'calendar' end
    if not int(mult, 1, BIG - 1) then return 'multiplier' end
    if not int(cost, -BIG, BIG) then return 'cost' end
    if not FLAGS[flags] then return 'flags' end
    return nil
  end
  local nseg = tonumber(ARGV[1])
  if not int(nseg, 1, BIG - 1) then return bad('segment count') end
  local a, k = 2, 1 -- next ARGV, next KEYS
  for s = 1, nseg do
    -- The header fixes the layout (how many ARGV and KEYS follow): a bad
    -- header fails the invocation. A bad now or hit field fails only its
    -- segment (reply line "!ERR ratelimitd take.lua: invalid segment: ...").
    local mode, nowarg, nonce, nh = ARGV[a], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3])
    if (mode ~= 't' and mode ~= 'r') or nonce == nil or nowarg == nil or not int(nh, 0, BIG - 1) then
      return bad('header of segment ' .. s)
    end
    local problem = nil
    local snow = false
    if nowarg ~= '' then
      snow = tonumber(nowarg)
      if not int(snow, 1 - BIG, BIG - 1) then problem = 'now' end
    end
    a = a + NS
    local hits = {}
    for i = 1, nh do
      local key, kind, rate, period, burst, cal, mult, cost, flags =
        KEYS[k], tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
        tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), ARGV[a + 7]
      if key == nil then return bad('keys of segment ' .. s) end
      if not problem then
        -- hit_problem's checks inline (the common, valid case makes no call)
        if not (kind and kind % 1 == 0 and kind >= 0 and kind <= 4)
          or not (rate and rate % 1 == 0 and rate > -BIG and rate < BIG)
          or not (period and period % 1 == 0 and period > 0 and period < BIG)
          or not (burst and burst % 1 == 0 and burst > -BIG and burst < BIG)
          or not (cal and cal % 1 == 0 and cal >= 0 and cal <= 2)
          or not (mult and mult % 1 == 0 and mult >= 1 and mult < BIG)
          or not (cost and cost % 1 == 0 and cost >= -BIG and cost <= BIG)
          or not FLAGS[flags] then
          problem = (hit_problem(kind, rate, period, burst, cal, mult, cost, flags) or 'a field') .. ' of hit ' .. i
        else
          if cost < 0 then cost = 0 end
          local fl = FLAGS[flags]
          hits[i] = {
            key = key, kind = kind, rate = rate, period = period, burst = burst, cal = cal, mult = mult,
            -- charge does not apply to concurrency (algo.Hit.Kept)
            cost = cost, idx = i, release = fl % 2 == 1, soft = fl % 4 >= 2, charge = fl >= 4 and kind ~= 4,
          }
        end
      end
      a = a + NF
      k = k + 1
    end
    if problem then
      -- nothing of this segment is read, written or defined for
      segs[s] = { err = 'ERR ratelimitd take.lua: invalid segment: ' .. problem }
    else
      if nowarg == '' then needtime = true end
      -- fast: a take of string kinds on distinct keys (checked below)
      local fast = mode == 't'
      for i = 1, nh do
        local h = hits[i]
        used[h.kind] = true
        if h.cal ~= 0 then anycal = true end
        if h.kind == 2 or h.kind == 4 then
          fast = false
        else
          nskeys = nskeys + 1
          skeys[nskeys] = h.key
        end
      end
      if fast and nh > 1 then
        if nh == 2 then
          fast = hits[1].key ~= hits[2].key
        else
          local seen = {}
          for i = 1, nh do
            local key = hits[i].key
            if seen[key] then fast = false break end
            seen[key] = true
          end
        end
      end
      if not fast then anyslow = true end
      segs[s] = { mode = mode, now = snow, nonce = nonce, hits = hits, fast = fast }
    end
  end
  if a - 1 ~= #ARGV or k - 1 ~= #KEYS then return bad('length') end
end

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

local function imod(a, b)
  return a - idiv(a, b) * b
end
-- Calendar (calendar.go) ----------------------------------------------------
local cal_bounds
if anycal then
  local DAY = 86400000000

  local function days_from_civil(y, m, d)
    if m <= 2 then y = y - 1 end
    local era = idiv(y, 400)
    local yoe = y - era * 400
    local mp = imod(m + 9, 12)
    local doy = idiv(153 * mp + 2, 5) + d - 1
    local doe = yoe * 365 + idiv(yoe, 4) - idiv(yoe, 100) + doy
    return era * 146097 + doe - 719468
  end

  local function civil_from_days(z)
    z = z + 719468
    local era = idiv(z, 146097)
    local doe = z - era * 146097
    local yoe = idiv(doe - idiv(doe, 1460) + idiv(doe, 36524) - idiv(doe, 146096), 365)
    local y = yoe + era * 400
    local doy = doe - (365 * yoe + idiv(yoe, 4) - idiv(yoe, 100))
    local mp = idiv(5 * doy + 2, 153)
    local m
    if mp < 10 then m = mp + 3 else m = mp - 9 end
    if m <= 2 then y = y + 1 end
    return y, m
  end

  local function month_start(mi)
    local y = 1970 + idiv(mi, 12)
    local m = mi - idiv(mi, 12) * 12 + 1
    return days_from_civil(y, m, 1) * DAY
  end

  cal_bounds = function(h, t)
    local y, m = civil_from_days(idiv(t, DAY))
    local mult = h.mult
    if h.cal == 1 then
      local mi = (y - 1970) * 12 + (m - 1)
      local k = idiv(mi, mult) * mult
      return month_start(k), month_start(k + mult)
    end
    local k = idiv(y - 1970, mult) * mult
    return month_start(k * 12), month_start((k + mult) * 12)
  end
end

-- bounds(h, t) is algo.WindowBoundsUs.
local function bounds(h, t)
  if h.cal == 1 or h.cal == 2 then return cal_bounds(h, t) end
  local s = idiv(t, h.period) * h.period
  return s, s + h.period
end

-- Helpers ---------------------------------------------------------------------

local function fmt(n)
  return format('%d', n)
end

-- ttl_ms turns an expiry instant into a PX value: rounded up to the ms,
-- plus 1 ms because Redis adds PX to its command-start time in whole ms
-- (up to 1 ms before TIME). With a pinned clock (tests) a second of slack
-- keeps real time, which passes between a test's steps, from expiring a key
-- the pinned clock still needs.
local function ttl_ms(at)
  local us = at - now
  local ms = idiv(us + 999, 1000) + 1
  if ms < 1 then ms = 1 end
  if pinned then ms = ms + 1000 end
  return fmt(ms)
end

-- decision constructor: d(allowed, remaining, retry, reset, window)
local function dec(allowed, rem, retry, reset, window)
  return { allowed = allowed, rem = rem, retry = retry or 0, reset = reset or 0, window = window or 0 }
end

-- String kinds ------------------------------------------------------------------
-- State as up to three numbers (a, b, c); a missing key is 0, 0, 0.
-- parse(v) splits a value like pkg/algo's reader: the first three
-- space-separated fields, tonumber each (nil when missing).
local function parse(v)
  if not v then return 0, 0, 0 end
  local i = find(v, ' ', 1, true)
  if not i then return tonumber(v) end
  local j = find(v, ' ', i + 1, true)
  if not j then return tonumber(sub(v, 1, i - 1)), tonumber(sub(v, i + 1)) end
  local l = find(v, ' ', j + 1, true)
  if not l then
    return tonumber(sub(v, 1, i - 1)), tonumber(sub(v, i + 1, j - 1)), tonumber(sub(v, j + 1))
  end
  return tonumber(sub(v, 1, i - 1)), tonumber(sub(v, i + 1, j - 1)), tonumber(sub(v, j + 1, l - 1))
end

-- sset writes a string state value with its TTL, or deletes it; the cache
-- follows only a write that happened.
local function sset(key, v, at)
  call('SET', key, v, 'PX', ttl_ms(at))
  cache[key] = v
end

local function sdel(key)
  call('DEL', key)
  cache[key] = false
end

-- Each kind: decide(h, a, b, c, cost) -> allowed, remaining, retry, reset,
-- window, changed, na, nb, nc (the new state when changed; a denied
-- charge, h.charge, changes it too); save(h, a, b, c); refund(h, a, b, c,
-- cost) -> changed, na, nb, nc (reverses a take exactly, mode "r");
-- credit(h, a, b, c, n) -> changed, na, nb, nc (algo.Release: returns n
-- units; 0, 0, 0 is the empty state).
local DECIDE, SAVE, REFUND, CREDIT = {}, {}, {}, {}

-- fixed_window (take.go fixedWindow): a = window start, b = count.
if used[0] then
  DECIDE[0] = function(h, time, cnt, _, cost)
    local ws, we = bounds(h, now)
    local count = 0
    if time == ws then
      count = cnt
    elseif time > ws then
      ws = time
      local _
      _, we = bounds(h, ws)
      count = cnt
    end
    local rem = max(h.rate - count, 0)
    local reset = we - now
    if max(cost, 1) > rem then
      if h.charge and cost > 0 then -- over the limit, saturating at 2^53
        return false, 0, reset, reset, reset, true, ws, min(count + cost, BIG), 0
      end
      return false, rem, reset, reset, reset, false
    end
    if cost == 0 then
      return true, rem, 0, reset, reset, false
    end
    return true, rem - cost, 0, reset, reset, true, ws, count + cost, 0
  end
  SAVE[0] = function(h, time, count)
    if count > 0 then
      local _, we = bounds(h, time)
      sset(h.key, format('%d %d', time, count), we)
    else
      sdel(h.key)
    end
  end
  REFUND[0] = function(h, time, count, _, cost)
    local ws = bounds(h, now)
    if time ~= ws or count <= 0 then return false end
    return true, time, max(count - cost, 0), 0
  end
  CREDIT[0] = function(h, time, count, _, n) -- take.go creditFixed
    local ws = bounds(h, now)
    if time < ws or count <= 0 then return false end
    local c = max(count - n, 0)
    if c == 0 then return true, 0, 0, 0 end
    return true, time, c, 0
  end
end

-- sliding_window (take.go slidingWindow, swin): a = window start, b =
-- count, c = previous window's count.
if used[1] then
  -- swin's fields: rate, t (= now), tw, ws, we, we2, prev.
  local function sw_wait(rate, ws, we, we2, prev, curr, k)
    local t2
    local avail = rate - k - curr
    if avail >= 0 and prev > 0 then
      local x = (avail * (we - ws)) / prev
      t2 = we - floor(x)
    elseif curr > 0 then
      local x = ((rate - k) * (we2 - we)) / curr
      t2 = we2 - floor(x)
    else
      t2 = now + 1
    end
    return max(t2 - now, 1)
  end

  local function sw_reset(we, we2, curr)
    if curr > 0 then return we2 - now end
    return we - now
  end

  local function sw_window(rate, ws, we, we2, prev, curr, rem)
    if rem >= rate then return we - now end
    return sw_wait(rate, ws, we, we2, prev, curr, rem + 1)
  end

  DECIDE[1] = function(h, time, cnt, pcnt, cost)
    local ws, we = bounds(h, now)
    local curr, prev = 0, 0
    if time == ws then
      curr, prev = cnt, pcnt
    elseif time > ws then
      ws = time
      local _
      _, we = bounds(h, ws)
      curr, prev = cnt, pcnt
    else
      local ps = bounds(h, ws - 1)
      if time == ps then prev = cnt end
    end
    local tw = max(now, ws)
    local _, we2 = bounds(h, we)
    local rate = h.rate
    -- sw_remaining
    local w = (we - tw) / (we - ws)
    local est = prev * w + curr
    local rem = max(floor(rate - est), 0)
    local need = max(cost, 1)
    if need > rem then
      local changed = false
      if h.charge and cost > 0 then -- over the limit, saturating at 2^53
        curr = min(curr + cost, BIG)
        rem = max(floor(rate - (prev * w + curr)), 0)
        changed = true
      end
      local retry = we - now
      if need <= rate then retry = sw_wait(rate, ws, we, we2, prev, curr, need) end
      return false, rem, retry, sw_reset(we, we2, curr), sw_window(rate, ws, we, we2, prev, curr, rem), changed,
        ws, curr, prev
    end
    if cost > 0 then
      curr = curr + cost
      rem = rem - cost
      return true, rem, 0, sw_reset(we, we2, curr), sw_window(rate, ws, we, we2, prev, curr, rem), true,
        ws, curr, prev
    end
    return true, rem, 0, sw_reset(we, we2, curr), sw_window(rate, ws, we, we2, prev, curr, rem), false
  end
  SAVE[1] = function(h, time, count, prev)
    -- algo.ExpiresAtUs
    local _, e = bounds(h, time)
    if count > 0 then
      local _2
      _2, e = bounds(h, e)
    elseif prev <= 0 then
      sdel(h.key)
      return
    end
    sset(h.key, format('%d %d %d', time, count, prev), e)
  end
  REFUND[1] = function(h, time, count, prev, cost)
    local ws, we = bounds(h, now)
    if time == ws then
      return true, time, max(count - cost, 0), prev
    elseif time == we then -- the window rolled over since the take
      return true, time, count, max(prev - cost, 0)
    end
    return false
  end
  CREDIT[1] = function(h, time, cnt, pcnt, n) -- take.go creditSliding
    local ws = bounds(h, now)
    local curr, prev = 0, 0
    if time >= ws then
      ws, curr, prev = time, cnt, pcnt
    else
      local ps = bounds(h, ws - 1)
      if time == ps then prev = cnt end
    end
    if curr <= 0 and prev <= 0 then return false end
    local c = max(curr - n, 0)
    local p = max(prev - (n - (curr - c)), 0)
    if c == 0 and p == 0 then return true, 0, 0, 0 end
    return true, ws, c, p
  end
end

-- token_bucket (take.go tokenBucket): GCRA with an exact rational TAT;
-- a = tat_us, b = tat_frac.
if used[3] then
  local function waitFor(q, m, r, sUs, sFrac, k)
    local du, df = k * q + idiv(k * m, r) - sUs, imod(k * m, r) - sFrac
    if df < 0 then
      df = df + r
      du = du - 1
    end
    if df > 0 then du = du + 1 end
    return du
  end
  local function fullIn(tat, frac)
    local d = tat - now
    if frac > 0 then d = d + 1 end
    return max(d, 0)
  end
  local function nextw(q, m, r, b, tat, frac, sUs, sFrac, rem)
    if rem >= b or fullIn(tat, frac) == 0 then return q + min(m, 1) end
    return waitFor(q, m, r, sUs, sFrac, rem + 1)
  end

  DECIDE[3] = function(h, tat, frac, _, cost)
    local t = now
    local r = h.rate
    local b = h.burst
    if b <= 0 then b = r end
    local p = h.period
    local q, m = idiv(p, r), imod(p, r)
    if frac < 0 or frac >= r then tat, frac = tat + 1, 0 end
    if tat < t then tat, frac = t, 0 end
    local tauUs, tauFrac = b * q + idiv(b * m, r), imod(b * m, r)
    local sUs, sFrac = tauUs - (tat - t), tauFrac - frac
    if sFrac < 0 then
      sFrac = sFrac + r
      sUs = sUs - 1
    end
    local rem = 0
    if sUs >= 0 then rem = idiv(sUs * r + sFrac, p) end
    local need = max(cost, 1)
    if need > rem then
      local changed = false
      if h.charge and cost > 0 then
        -- TAT += cost*T in at most two steps of b, at most t + 2*tau (one
        -- capacity of debt), never moved back.
        local bUs, bF = t + 2 * tauUs + idiv(2 * tauFrac, r), imod(2 * tauFrac, r)
        local nt, nf, left = tat, frac, cost
        for _ = 1, 2 do
          if left <= 0 then break end
          local k = min(left, b)
          left = left - k
          local n = nf + k * m
          nt, nf = nt + k * q + idiv(n, r), imod(n, r)
          if nt > bUs or (nt == bUs and nf > bF) then
            nt, nf = bUs, bF
            if tat > bUs or (tat == bUs and frac > bF) then nt, nf = tat, frac end
            break
          end
        end
        tat, frac = nt, nf
        sUs, sFrac = tauUs - (tat - t), tauFrac - frac
        if sFrac < 0 then
          sFrac = sFrac + r
          sUs = sUs - 1
        end
        rem = 0
        if sUs >= 0 then rem = idiv(sUs * r + sFrac, p) end
        changed = true
      end
      local retry = p
      if need <= b then retry = waitFor(q, m, r, sUs, sFrac, need) end
      return false, rem, retry, fullIn(tat, frac), nextw(q, m, r, b, tat, frac, sUs, sFrac, rem), changed,
        tat, frac, 0
    end
    if cost == 0 then
      return true, rem, 0, fullIn(tat, frac), nextw(q, m, r, b, tat, frac, sUs, sFrac, rem), false
    end
    local n = frac + cost * m
    tat, frac = tat + cost * q + idiv(n, r), imod(n, r)
    sUs, sFrac = tauUs - (tat - t), tauFrac - frac
    if sFrac < 0 then
      sFrac = sFrac + r
      sUs = sUs - 1
    end
    rem = rem - cost
    return true, rem, 0, fullIn(tat, frac), nextw(q, m, r, b, tat, frac, sUs, sFrac, rem), true, tat, frac, 0
  end
  SAVE[3] = function(h, tat, frac)
    -- algo.ExpiresAtUs
    local e = tat
    if frac > 0 then e = e + 1 end
    if e <= now then
      sdel(h.key)
      return
    end
    sset(h.key, format('%d %d', tat, frac), e)
  end
  REFUND[3] = function(h, tat, frac, _, cost)
    if tat == 0 and frac == 0 then return false end
    local r = h.rate
    local q, m = idiv(h.period, r), imod(h.period, r)
    local n = frac - cost * m
    return true, tat - cost * q + idiv(n, r), imod(n, r), 0
  end
  CREDIT[3] = function(h, tat, frac, _, n) -- take.go creditToken
    local r = h.rate
    local b = h.burst
    if b <= 0 then b = r end
    local q, m = idiv(h.period, r), imod(h.period, r)
    if frac < 0 or frac >= r then tat, frac = tat + 1, 0 end
    if tat < now then return false end
    for _ = 1, 2 do
      if n <= 0 then break end
      local k = min(n, b)
      n = n - k
      tat, frac = tat - (k * q + idiv(k * m, r)), frac - imod(k * m, r)
      if frac < 0 then
        frac = frac + r
        tat = tat - 1
      end
      if tat < now then break end
    end
    if tat < now or (tat == now and frac == 0) then return true, 0, 0, 0 end
    return true, tat, frac, 0
  end
end

-- rate0_window is the retry, reset and window of a rate-0 limit (always
-- denied): the rest of the window for fixed and sliding windows, else the
-- period.
local function rate0_window(h)
  if h.kind == 0 or h.kind == 1 then
    local _, e = bounds(h, now)
    return e - now
  end
  return h.period
end

-- sdecide is algo.Apply for a string kind: release (a credit, then a
-- check on the credited state, allowed), rate 0, then the kind.
local function sdecide(h, a, b, c, cost)
  if h.release then
    if h.rate <= 0 then
      local w = rate0_window(h)
      return true, 0, 0, w, w, false
    end
    local changed, na, nb, nc = false, a, b, c
    if cost > 0 then
      local ch, x, y, z = CREDIT[h.kind](h, a, b, c, cost)
      if ch then changed, na, nb, nc = true, x, y, z end
    end
    local _, rem, _, reset, window = DECIDE[h.kind](h, na, nb, nc, 0)
    return true, rem, 0, reset, window, changed, na, nb, nc
  end
  if h.rate <= 0 then
    local w = rate0_window(h)
    return false, 0, w, w, w, false
  end
  return DECIDE[h.kind](h, a, b, c, cost)
end

-- K: the table-state interface of every kind, for the general path
-- (repeated keys, sorted sets, refunds): load(h) -> st; decide(h, st,
-- cost) -> st', decision; save(h, st); refund(h, st, cost) -> st';
-- credit(h, st, n) -> st' (algo.Release outside concurrency).
local K = {}
for _, kind in ipairs({ 0, 1, 3 }) do
  if used[kind] and anyslow then
    local decide, save, refund, credit = DECIDE[kind], SAVE[kind], REFUND[kind], CREDIT[kind]
    K[kind] = {
      load = function(h)
        local a, b, c = parse(sget(h.key))
        return { time = a, count = b, prev = c }
      end,
      decide = function(h, st, cost)
        local al, rem, retry, reset, window, changed, a, b, c = decide(h, st.time, st.count, st.prev, cost)
        local d = dec(al, rem, retry, reset, window)
        if changed then return { time = a, count = b, prev = c, dirty = true }, d end
        return st, d
      end,
      save = function(h, st) save(h, st.time, st.count, st.prev) end,
      refund = function(h, st, cost)
        local changed, a, b, c = refund(h, st.time, st.count, st.prev, cost)
        if changed then return { time = a, count = b, prev = c, dirty = true } end
        return st
      end,
      credit = function(h, st, n)
        local changed, a, b, c = credit(h, st.time, st.count, st.prev, n)
        if changed then return { time = a, count = b, prev = c, dirty = true } end
        return st
      end,
    }
  end
end

-- sliding_log and concurrency (take.go timestampLog, release1) --------------
local log_save
if used[2] or used[4] then
  -- The state is the live part of the sorted set (scores > now - period),
  -- read lazily: n0 live entries in Redis of which `dropped` oldest are
  -- released and `cut` newest are credited back (sliding_log), then the
  -- `added` timestamps of this request (all >= the newest live entry, so
  -- the order is the sorted set's).
  local function log_len(st) return st.n0 - st.dropped - st.cut + #st.added end

  -- log_at returns the i-th (1-based) live timestamp.
  local function log_at(st, i)
    local j = i + st.dropped
    if j <= st.n0 - st.cut then
      local rank = st.off + j - 1
      local v = st.memo[rank] -- ranks are stable until the script writes
      if not v then
        local r = redis.call('ZRANGE', st.key, fmt(rank), fmt(rank), 'WITHSCORES')
        v = tonumber(r[2])
        st.memo[rank] = v
      end
      return v
    end
    return st.added[j - (st.n0 - st.cut)]
  end

  local function log_decision(d, st, p)
    local n = log_len(st)
    if n > 0 then
      d.reset = log_at(st, n) + p - now
      d.window = log_at(st, 1) + p - now
    else
      d.window = p
    end
    return d
  end

  local function log_copy(st)
    local a = {}
    for i, x in ipairs(st.added) do a[i] = x end
    return {
      key = st.key, off = st.off, n0 = st.n0, dropped = st.dropped, cut = st.cut, added = a, dirty = st.dirty,
      memo = st.memo,
    }
  end

  local LOG = {
    load = function(h)
      local cut = now - h.period
      local total = redis.call('ZCARD', h.key)
      local off, n0 = 0, 0
      if total > 0 then
        off = redis.call('ZCOUNT', h.key, '-inf', fmt(cut))
        n0 = total - off
      end
      return { key = h.key, off = off, n0 = n0, dropped = 0, cut = 0, added = {}, memo = {} }
    end,
    decide = function(h, st, cost)
      local p = h.period
      local rem = max(h.rate - log_len(st), 0)
      local need = max(cost, 1)
      if need > rem and h.charge and cost > 0 and h.kind == 2 then
        -- always_charge (sliding_log): the log grows to at most 2*rate
        local n = log_len(st)
        local k = min(cost, 2 * h.rate - n)
        if k > 0 then
          local ns = log_copy(st)
          local ts = now
          if n > 0 then ts = max(ts, log_at(st, n)) end
          for _ = 1, k do ns.added[#ns.added + 1] = ts end
          ns.dirty = true
          st = ns
          rem = max(h.rate - log_len(st), 0)
        end
      end
      if need > rem then
        local retry = p
        if need <= h.rate then
          local e = log_len(st) + need - h.rate
          retry = log_at(st, e) + p - now
        end
        return st, log_decision(dec(false, rem, retry), st, p)
      end
      if cost == 0 then
        return st, log_decision(dec(true, rem), st, p)
      end
      local ns = log_copy(st)
      local ts = now
      local n = log_len(st)
      if n > 0 then ts = max(ts, log_at(st, n)) end
      for _ = 1, cost do ns.added[#ns.added + 1] = ts end
      ns.dirty = true
      ns.hit = h.idx
      ns.marks = ns.marks or {}
      return ns, log_decision(dec(true, rem - cost), ns, p)
    end,
    release = function(h, st, n)
      local p = h.period
      local ns = st
      if n > 0 then
        ns = log_copy(st)
        local k = min(n, log_len(ns))
        local fromRedis = min(k, ns.n0 - ns.dropped - ns.cut)
        ns.dropped = ns.dropped + fromRedis
        for _ = 1, k - fromRedis do table.remove(ns.added, 1) end
        ns.dirty = true
      end
      local rem = max(h.rate - log_len(ns), 0)
      return ns, log_decision(dec(true, rem), ns, p)
    end,
    -- credit drops the n newest live entries (take.go creditLog): this
    -- request's additions first, then the newest in Redis.
    credit = function(_, st, n)
      local k = min(n, log_len(st))
      if k <= 0 then return st end
      local ns = log_copy(st)
      local fromAdded = min(k, #ns.added)
      for _ = 1, fromAdded do ns.added[#ns.added] = nil end
      ns.cut = ns.cut + (k - fromAdded)
      ns.dirty = true
      return ns
    end,
  }

  -- Members of added timestamps: nonce.hit.unit, unique per request and hit.
  -- `owner` records, per added timestamp, the hit index that added it.
  log_save = function(h, st, members)
    local cut = now - h.period
    local n = log_len(st)
    local last
    if n > 0 then last = log_at(st, n) end -- read before the ranks shift
    cache[h.key] = nil -- no longer a known string value
    if st.off > 0 then redis.call('ZREMRANGEBYSCORE', h.key, '-inf', fmt(cut)) end
    if st.dropped > 0 then redis.call('ZREMRANGEBYRANK', h.key, '0', fmt(st.dropped - 1)) end
    if st.cut > 0 then redis.call('ZREMRANGEBYRANK', h.key, fmt(-st.cut), '-1') end
    -- ZADD in batches: unpack() of more than LUAI_MAXCSTACK (8000) values
    -- fails, and a request may add up to MaxSlidingLogRate members.
    local args = {}
    for i = 1, #members do
      args[#args + 1] = fmt(st.added[i])
      args[#args + 1] = members[i]
      if #args >= 1000 or i == #members then
        redis.call('ZADD', h.key, unpack(args))
        args = {}
      end
    end
    if n == 0 then
      redis.call('DEL', h.key)
      return
    end
    redis.call('PEXPIRE', h.key, ttl_ms(last + h.period))
  end

  K[2] = LOG
  K[4] = LOG
end

-- Main ----------------------------------------------------------------------

-- apply is algo.Apply / decide: release, rate 0, then the kind.
local function apply(h, st, cost)
  local k = K[h.kind]
  if h.release then
    if h.kind == 4 then return k.release(h, st, cost) end
    -- a credit, then a check on the credited state, allowed
    if h.rate <= 0 then
      local w = rate0_window(h)
      return st, dec(true, 0, 0, w, w)
    end
    local ns = st
    if cost > 0 then ns = k.credit(h, st, cost) end
    local _, d = k.decide(h, ns, 0)
    d.allowed, d.retry = true, 0
    return ns, d
  end
  if h.rate <= 0 then
    local w = rate0_window(h)
    return st, dec(false, 0, w, w, w)
  end
  return k.decide(h, st, cost)
end

-- check is the decision of a check (cost 0, not a release) of h on st:
-- the value before the request (algo.Take(l, st, now, 0)).
local function check(h, st)
  local c = {}
  for k, v in pairs(h) do c[k] = v end
  c.release = false
  local _, d = apply(c, st, 0)
  return d
end

-- nowstr is fmt(now), formatted once per distinct instant.
local nowstr, nowstr_of = '', nil
local function now_text()
  if nowstr_of ~= now then
    nowstr, nowstr_of = fmt(now), now
  end
  return nowstr
end

-- hit_text is a hit's part of a reply line: 5 integers.
local function hit_text(allowed, rem, retry, reset, window)
  local a = 0
  if allowed then a = 1 end
  return format('%d %d %d %d %d', a, max(rem, 0), retry, max(reset, 0), max(window, 0))
end

-- reply is the segment's line: now, then 5 integers per hit.
local function reply(decisions)
  local out = { now_text() }
  for i, d in ipairs(decisions) do
    out[i + 1] = hit_text(d.allowed, d.rem, d.retry, d.reset, d.window)
  end
  return concat(out, ' ')
end

-- refund reverses a take (mode "r"): each hit in reverse order, then the
-- check-only decisions on the restored state (the values before the take).
-- Every refunded state is computed before the first write.
local function refund(seg, hits, states, first)
  local zrem = {}
  for i = #hits, 1, -1 do
    local h = hits[i]
    if h.cost > 0 and not h.release and h.rate > 0 then
      if h.kind == 2 or h.kind == 4 then
        for j = 1, h.cost do
          zrem[#zrem + 1] = h.key
          zrem[#zrem + 1] = seg.nonce .. '.' .. h.idx .. '.' .. j
        end
      else
        states[h.key] = K[h.kind].refund(h, states[h.key], h.cost)
      end
    end
  end
  for j = 1, #zrem, 2 do
    cache[zrem[j]] = nil
    call('ZREM', zrem[j], zrem[j + 1])
  end
  for _, h in ipairs(first) do
    local st = states[h.key]
    if st.dirty then K[h.kind].save(h, st) end
  end
  local decisions = {}
  for i, h in ipairs(hits) do
    decisions[i] = check(h, K[h.kind].load(h))
  end
  return reply(decisions)
end

-- segment decides one segment and returns its reply line. Phase 1 (loads
-- and decisions) only reads; phase 2 writes, and only when it allowed.
local function segment(seg)
  local hits = seg.hits
  local states = {}   -- key -> current (tentative) state
  local initial = {}  -- key -> state before the request
  local first = {}    -- keys in first-use order, with the hit that loaded them
  local members = {}  -- key -> list of new log members, in added order

  for _, h in ipairs(hits) do
    if not states[h.key] then
      local st = K[h.kind].load(h)
      states[h.key] = st
      initial[h.key] = st
      first[#first + 1] = h
      members[h.key] = {}
    end
  end

  if seg.mode == 'r' then return refund(seg, hits, states, first) end

  -- step applies hit h to states (and its new log members to members).
  local function step(h, states, members)
    local st = states[h.key]
    local ns, d = apply(h, st, h.cost)
    if (h.kind == 2 or h.kind == 4) and ns ~= st and #ns.added > #st.added then
      local ms = members[h.key]
      for j = 1, #ns.added - #st.added do
        ms[#ms + 1] = seg.nonce .. '.' .. h.idx .. '.' .. j
      end
    end
    states[h.key] = ns
    return d
  end

  local decisions = {}
  local denied = false
  for i, h in ipairs(hits) do
    local d = step(h, states, members)
    if not d.allowed and not h.soft then denied = true end
    decisions[i] = d
  end

  if denied then
    -- Replay on the states before the request with only the kept hits
    -- (release, charge): they are written; the other hits that did not
    -- deny report a check at their place (algotest.Reference).
    local kept = false
    states, members = {}, {}
    for key, st in pairs(initial) do
      states[key] = st
      members[key] = {}
    end
    for i, h in ipairs(hits) do
      if h.release or h.charge then
        decisions[i] = step(h, states, members)
        kept = true
      elseif decisions[i].allowed then
        decisions[i] = check(h, states[h.key])
      end
    end
    if not kept then return reply(decisions) end
  end
  local line = reply(decisions)
  for _, h in ipairs(first) do
    local st = states[h.key]
    if st.dirty then
      if h.kind == 2 or h.kind == 4 then
        -- a release may have dropped added entries: keep the newest members
        local ms = members[h.key]
        local extra = #ms - #st.added
        local keep = {}
        for j = extra + 1, #ms do keep[#keep + 1] = ms[j] end
        log_save(h, st, keep)
      else
        K[h.kind].save(h, st)
      end
    end
  end
  return line
end

-- fast_segment is segment for a take of string kinds on distinct keys
-- (seg.fast): each hit loads, decides and saves its own key once, so the
-- states are plain numbers and no per-hit table is built. Same phases.
-- A, B, C hold the states before the request, NA, NB, NC the new ones
-- (AL: allowed, CH: changed), R the hits' reply texts; reused by every segment.
local A, B, C, NA, NB, NC, AL, CH, R = {}, {}, {}, {}, {}, {}, {}, {}, {}
local function fast_segment(seg)
  local hits = seg.hits
  local n = #hits
  for i = 1, n do
    A[i], B[i], C[i] = parse(sget(hits[i].key))
  end
  local denied = false
  local kept = false
  for i = 1, n do
    local h = hits[i]
    local al, rem, retry, reset, window, changed, a, b, c = sdecide(h, A[i], B[i], C[i], h.cost)
    if not al and not h.soft then denied = true end
    if h.release or h.charge then kept = true end
    AL[i], CH[i], NA[i], NB[i], NC[i] = al, changed, a, b, c
    R[i] = hit_text(al, rem, retry, reset, window)
  end
  if denied then
    -- Only the kept hits (release, charge) are written: on distinct keys
    -- their replay is this pass. The other hits that did not deny report
    -- the value before the request: a check (cost 0) on the state before it.
    for i = 1, n do
      local h = hits[i]
      if not (h.release or h.charge) then
        if AL[i] then R[i] = hit_text(sdecide(h, A[i], B[i], C[i], 0)) end
        CH[i] = false
      end
    end
  end
  local line
  if n == 1 then
    line = now_text() .. ' ' .. R[1]
  else
    R[0] = now_text()
    line = concat(R, ' ', 0, n)
  end
  if denied and not kept then return line end
  for i = 1, n do
    if CH[i] then
      local h = hits[i]
      SAVE[h.kind](h, NA[i], NB[i], NC[i])
    end
  end
  return line
end

-- errtext is a caught error as one line: a Redis error reply ("OOM ...",
-- "READONLY ...", "WRONGTYPE ...") or a Lua error message.
local function errtext(e)
  if type(e) == 'table' then e = e.err end
  return (string.gsub(tostring(e), '[\r\n]', ' '))
end

-- line_of decides one segment and returns its reply line: the decisions,
-- or "!" and the error that failed it (its validation, or a Redis or Lua
-- error under pcall).
local function line_of(seg)
  if seg.err then return '!' .. seg.err end
  if seg.now then
    now, pinned = seg.now, true
  else
    now, pinned = server_now, false
  end
  local ok, line
  if seg.fast then
    ok, line = pcall(fast_segment, seg)
  else
    ok, line = pcall(segment, seg)
  end
  if ok then return line end
  return '!' .. errtext(line)
end

local lines = {}
for s = 1, #segs do
  lines[s] = line_of(segs[s])
end
return concat(lines, '\n')
