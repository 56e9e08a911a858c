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
--          (1 = release: return concurrency leases; 2 = soft: a denial
--          does not deny the request).
--
-- Reply: one bulk string, one line per segment, lines joined by "\n":
--   "<now_us> then per hit: <allowed 0/1> <remaining> <retry_us>
--    <reset_us> <window_us>" (integers separated by one space), or
--   "!<error>" when that segment failed (nothing of it was written; see
--          Errors). Durations are integer microseconds.
--
-- Errors. A malformed ARGV/KEYS layout fails the whole invocation before
-- anything is read or written. Each segment runs under pcall in two
-- phases: (1) reads and decisions, no write; (2) writes, only when it
-- allowed. An error in phase 1 (e.g. WRONGTYPE, a corrupted value) becomes
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

local NF = 8 -- fields per hit
local NS = 4 -- header fields per segment

local floor = math.floor
local max = math.max
local min = math.min

-- Parse and validate every segment before anything runs. Functions below
-- are defined once per invocation, and only for the kinds it uses.
local function isint(x)
  return x ~= nil and x == floor(x) and x > -9007199254740992 and x < 9007199254740992
end

local used = {}
local anycal = false
local segs = {}
local needtime = false
do
  local bad = function(what)
    return redis.error_reply('ERR ratelimitd take.lua: malformed arguments: ' .. what)
  end
  local nseg = tonumber(ARGV[1])
  if not isint(nseg) or nseg < 1 then return bad('segment count') end
  local a, k = 2, 1 -- next ARGV, next KEYS
  for s = 1, nseg do
    local mode, nowarg, nonce, nh = ARGV[a], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3])
    if (mode ~= 't' and mode ~= 'r') or nonce == nil or not isint(nh) or nh < 0 then
      return bad('header of segment ' .. s)
    end
    local snow = false
    if nowarg == '' then
      needtime = true
    else
      snow = tonumber(nowarg)
      if not isint(snow) then return bad('now of segment ' .. s) end
    end
    a = a + NS
    local hits = {}
    for i = 1, nh do
      local h = {
        key = KEYS[k],
        kind = tonumber(ARGV[a]),
        rate = tonumber(ARGV[a + 1]),
        period = tonumber(ARGV[a + 2]),
        burst = tonumber(ARGV[a + 3]),
        cal = tonumber(ARGV[a + 4]),
        mult = tonumber(ARGV[a + 5]),
        cost = tonumber(ARGV[a + 6]),
        idx = i,
      }
      local flags = ARGV[a + 7]
      if h.key == nil or not (isint(h.kind) and h.kind >= 0 and h.kind <= 4)
        or not isint(h.rate) or not (isint(h.period) and h.period > 0) or not isint(h.burst)
        or not (isint(h.cal) and h.cal >= 0 and h.cal <= 2) or not (isint(h.mult) and h.mult >= 1)
        or not isint(h.cost)
        or (flags ~= '0' and flags ~= '1' and flags ~= '2' and flags ~= '3') then
        return bad('hit ' .. i .. ' of segment ' .. s)
      end
      h.cost = max(h.cost, 0)
      h.release = flags == '1' or flags == '3'
      h.soft = flags == '2' or flags == '3'
      hits[i] = h
      used[h.kind] = true
      if h.cal ~= 0 then anycal = true end
      a = a + NF
      k = k + 1
    end
    segs[s] = { mode = mode, now = snow, nonce = nonce, hits = hits }
  end
  if a - 1 ~= #ARGV or k - 1 ~= #KEYS then return bad('length') end
end

-- now is the instant of the segment being decided (set per segment below);
-- every function reads it. pinned: the segment's now came from ARGV.
local now
local pinned = false
local server_now = 0
if needtime then
  local t = redis.call('TIME')
  server_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
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

local function fields(v)
  local out, i = {}, 1
  while true do
    local j = string.find(v, ' ', i, true)
    if not j then
      out[#out + 1] = tonumber(string.sub(v, i))
      return out
    end
    out[#out + 1] = tonumber(string.sub(v, i, j - 1))
    i = j + 1
  end
end

local function fmt(n)
  return string.format('%d', n)
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
  return ms
end

-- decision constructor: d(allowed, remaining, retry, reset, window)
local function dec(allowed, rem, retry, reset, window)
  return { allowed = allowed, rem = rem, retry = retry or 0, reset = reset or 0, window = window or 0 }
end

local K = {}

-- fixed_window (take.go fixedWindow) ----------------------------------------
if used[0] then
  K[0] = {
    load = function(h)
      local v = redis.call('GET', h.key)
      if not v then return { time = 0, count = 0 } end
      local f = fields(v)
      return { time = f[1], count = f[2] }
    end,
    decide = function(h, st, cost)
      local ws, we = bounds(h, now)
      local count = 0
      if st.time == ws then
        count = st.count
      elseif st.time > ws then
        ws = st.time
        local _
        _, we = bounds(h, ws)
        count = st.count
      end
      local rem = max(h.rate - count, 0)
      local reset = we - now
      if max(cost, 1) > rem then
        return st, dec(false, rem, reset, reset, reset)
      end
      if cost == 0 then
        return st, dec(true, rem, 0, reset, reset)
      end
      return { time = ws, count = count + cost, dirty = true }, dec(true, rem - cost, 0, reset, reset)
    end,
    save = function(h, st)
      if st.count > 0 then
        local _, we = bounds(h, st.time)
        redis.call('SET', h.key, fmt(st.time) .. ' ' .. fmt(st.count), 'PX', fmt(ttl_ms(we)))
      else
        redis.call('DEL', h.key)
      end
    end,
    refund = function(h, st, cost)
      local ws = bounds(h, now)
      if st.time ~= ws or st.count <= 0 then return st end
      return { time = st.time, count = max(st.count - cost, 0), dirty = true }
    end,
  }
end

-- sliding_window (take.go slidingWindow, swin) ------------------------------
if used[1] then
  local function sw_remaining(s, curr)
    local w = (s.we - s.tw) / (s.we - s.ws)
    local est = s.prev * w + curr
    local r = floor(s.rate - est)
    return max(r, 0)
  end

  local function sw_wait(s, curr, k)
    local t2
    local avail = s.rate - k - curr
    if avail >= 0 and s.prev > 0 then
      local x = (avail * (s.we - s.ws)) / s.prev
      t2 = s.we - floor(x)
    elseif curr > 0 then
      local x = ((s.rate - k) * (s.we2 - s.we)) / curr
      t2 = s.we2 - floor(x)
    else
      t2 = s.t + 1
    end
    return max(t2 - s.t, 1)
  end

  local function sw_reset(s, curr)
    if curr > 0 then return s.we2 - s.t end
    return s.we - s.t
  end

  local function sw_window(s, curr, rem)
    if rem >= s.rate then return s.we - s.t end
    return sw_wait(s, curr, rem + 1)
  end

  K[1] = {
    load = function(h)
      local v = redis.call('GET', h.key)
      if not v then return { time = 0, count = 0, prev = 0 } end
      local f = fields(v)
      return { time = f[1], count = f[2], prev = f[3] }
    end,
    decide = function(h, st, cost)
      local ws, we = bounds(h, now)
      local curr, prev = 0, 0
      if st.time == ws then
        curr, prev = st.count, st.prev
      elseif st.time > ws then
        ws = st.time
        local _
        _, we = bounds(h, ws)
        curr, prev = st.count, st.prev
      else
        local ps = bounds(h, ws - 1)
        if st.time == ps then prev = st.count end
      end
      local tw = max(now, ws)
      local _, we2 = bounds(h, we)
      local s = { rate = h.rate, t = now, tw = tw, ws = ws, we = we, we2 = we2, prev = prev }
      local rem = sw_remaining(s, curr)
      local need = max(cost, 1)
      if need > rem then
        local retry = we - now
        if need <= h.rate then retry = sw_wait(s, curr, need) end
        return st, dec(false, rem, retry, sw_reset(s, curr), sw_window(s, curr, rem))
      end
      local ns = st
      if cost > 0 then
        curr = curr + cost
        rem = rem - cost
        ns = { time = ws, count = curr, prev = prev, dirty = true }
      end
      return ns, dec(true, rem, 0, sw_reset(s, curr), sw_window(s, curr, rem))
    end,
    save = function(h, st)
      -- algo.ExpiresAtUs
      local _, e = bounds(h, st.time)
      if st.count > 0 then
        local _2
        _2, e = bounds(h, e)
      elseif st.prev <= 0 then
        redis.call('DEL', h.key)
        return
      end
      redis.call('SET', h.key, fmt(st.time) .. ' ' .. fmt(st.count) .. ' ' .. fmt(st.prev), 'PX', fmt(ttl_ms(e)))
    end,
    refund = function(h, st, cost)
      local ws, we = bounds(h, now)
      if st.time == ws then
        return { time = st.time, count = max(st.count - cost, 0), prev = st.prev, dirty = true }
      elseif st.time == we then -- the window rolled over since the take
        return { time = st.time, count = st.count, prev = max(st.prev - cost, 0), dirty = true }
      end
      return st
    end,
  }
end

-- token_bucket (take.go tokenBucket): GCRA with an exact rational TAT --------
if used[3] then
  K[3] = {
    load = function(h)
      local v = redis.call('GET', h.key)
      if not v then return { time = 0, count = 0 } end
      local f = fields(v)
      return { time = f[1], count = f[2] }
    end,
    decide = function(h, st, cost)
      local t = now
      local r = h.rate
      local b = h.burst
      if b <= 0 then b = r end
      local p = h.period
      local q, m = idiv(p, r), imod(p, r)
      local tat, frac = st.time, st.count
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
      local function waitFor(sUs, sFrac, k)
        local du, df = k * q + idiv(k * m, r) - sUs, imod(k * m, r) - sFrac
        if df < 0 then
          df = df + r
          du = du - 1
        end
        if df > 0 then du = du + 1 end
        return du
      end
      local function fullIn(tat, frac)
        local d = tat - t
        if frac > 0 then d = d + 1 end
        return max(d, 0)
      end
      local function nextw(tat, frac, sUs, sFrac, rem)
        if rem >= b or fullIn(tat, frac) == 0 then return q + min(m, 1) end
        return waitFor(sUs, sFrac, rem + 1)
      end
      local need = max(cost, 1)
      if need > rem then
        local retry = p
        if need <= b then retry = waitFor(sUs, sFrac, need) end
        return st, dec(false, rem, retry, fullIn(tat, frac), nextw(tat, frac, sUs, sFrac, rem))
      end
      if cost == 0 then
        return st, dec(true, rem, 0, fullIn(tat, frac), nextw(tat, frac, sUs, sFrac, rem))
      end
      local n = frac + cost * m
      tat, frac = tat + cost * q + idiv(n, r), imod(n, r)
      sUs, sFrac = tauUs - (tat - t), tauFrac - frac
      if sFrac < 0 then
        sFrac = sFrac + r
        sUs = sUs - 1
      end
      rem = rem - cost
      return { time = tat, count = frac, dirty = true },
        dec(true, rem, 0, fullIn(tat, frac), nextw(tat, frac, sUs, sFrac, rem))
    end,
    save = function(h, st)
      -- algo.ExpiresAtUs
      local e = st.time
      if st.count > 0 then e = e + 1 end
      if e <= now then
        redis.call('DEL', h.key)
        return
      end
      redis.call('SET', h.key, fmt(st.time) .. ' ' .. fmt(st.count), 'PX', fmt(ttl_ms(e)))
    end,
    refund = function(h, st, cost)
      if st.time == 0 and st.count == 0 then return st end
      local r = h.rate
      local q, m = idiv(h.period, r), imod(h.period, r)
      local n = st.count - cost * m
      return { time = st.time - cost * q + idiv(n, r), count = imod(n, r), dirty = true }
    end,
  }
end

-- sliding_log and concurrency (take.go timestampLog, release1) --------------
local log_save
if used[2] or used[4] then
  -- The state is the live part of the sorted set (scores > now - period),
  -- read lazily: n0 live entries in Redis of which `dropped` oldest are
  -- released, then the `added` timestamps of this request (all >= the
  -- newest live entry, so the order is the sorted set's).
  local function log_len(st) return st.n0 - st.dropped + #st.added end

  -- log_at returns the i-th (1-based) live timestamp.
  local function log_at(st, i)
    local j = i + st.dropped
    if j <= st.n0 then
      local rank = st.off + j - 1
      local v = st.memo[rank] -- ranks are stable until the script writes
      if not v then
        local r = redis.call('ZRANGE', st.key, fmt(rank), fmt(rank), 'WITHSCORES')
        v = tonumber(r[2])
        st.memo[rank] = v
      end
      return v
    end
    return st.added[j - st.n0]
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
    return { key = st.key, off = st.off, n0 = st.n0, dropped = st.dropped, added = a, dirty = st.dirty, memo = st.memo }
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
      return { key = h.key, off = off, n0 = n0, dropped = 0, added = {}, memo = {} }
    end,
    decide = function(h, st, cost)
      local p = h.period
      local rem = max(h.rate - log_len(st), 0)
      local need = max(cost, 1)
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
        local fromRedis = min(k, ns.n0 - ns.dropped)
        ns.dropped = ns.dropped + fromRedis
        for _ = 1, k - fromRedis do table.remove(ns.added, 1) end
        ns.dirty = true
      end
      local rem = max(h.rate - log_len(ns), 0)
      return ns, log_decision(dec(true, rem), ns, p)
    end,
  }

  -- Members of added timestamps: nonce.hit.unit, unique per request and hit.
  -- `owner` records, per added timestamp, the hit index that added it.
  log_save = function(h, st, members)
    local cut = now - h.period
    local n = log_len(st)
    local last
    if n > 0 then last = log_at(st, n) end -- read before the ranks shift
    if st.off > 0 then redis.call('ZREMRANGEBYSCORE', h.key, '-inf', fmt(cut)) end
    if st.dropped > 0 then redis.call('ZREMRANGEBYRANK', h.key, '0', fmt(st.dropped - 1)) end
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
    redis.call('PEXPIRE', h.key, fmt(ttl_ms(last + h.period)))
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
    cost = 0
  end
  if h.rate <= 0 then
    local w = h.period
    if h.kind == 0 or h.kind == 1 then
      local _, e = bounds(h, now)
      w = e - now
    end
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

-- reply is the segment's line: now, then 5 integers per hit.
local function reply(decisions)
  local out = { fmt(now) }
  for i, d in ipairs(decisions) do
    local a = 0
    if d.allowed then a = 1 end
    out[i + 1] = string.format('%d %d %d %d %d', a, max(d.rem, 0), d.retry, max(d.reset, 0), max(d.window, 0))
  end
  return table.concat(out, ' ')
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
    redis.call('ZREM', zrem[j], zrem[j + 1])
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

  local decisions = {}
  local denied = false
  for i, h in ipairs(hits) do
    local st = states[h.key]
    local before = st
    local ns, d = apply(h, st, h.cost)
    if (h.kind == 2 or h.kind == 4) and ns ~= before and #ns.added > #before.added then
      local ms = members[h.key]
      for j = 1, #ns.added - #before.added do
        ms[#ms + 1] = seg.nonce .. '.' .. h.idx .. '.' .. j
      end
    end
    states[h.key] = ns
    if not d.allowed and not h.soft then denied = true end
    decisions[i] = d
  end

  if denied then
    -- Nothing is written. Hits that did not deny report the value before the
    -- request: a check on the state before the request.
    for i, h in ipairs(hits) do
      if decisions[i].allowed then decisions[i] = check(h, initial[h.key]) end
    end
    return reply(decisions)
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

-- errtext is a caught error as one line: a Redis error reply ("OOM ...",
-- "READONLY ...", "WRONGTYPE ...") or a Lua error message.
local function errtext(e)
  if type(e) == 'table' then e = e.err end
  return (string.gsub(tostring(e), '[\r\n]', ' '))
end

local lines = {}
for s, seg in ipairs(segs) do
  if seg.now then
    now, pinned = seg.now, true
  else
    now, pinned = server_now, false
  end
  local ok, line = pcall(segment, seg)
  if ok then
    lines[s] = line
  else
    lines[s] = '!' .. errtext(line)
  end
end
return table.concat(lines, '\n')
