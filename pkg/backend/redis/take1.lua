-- ratelimitd: the fast path of take.lua for a batch in which every segment
-- is a take of exactly one hit of a string kind (fixed_window,
-- sliding_window, token_bucket) without a calendar, a release or a charge,
-- of rate >= 1 and cost >= 0: the common single-descriptor request. The
-- Go side selects it only for such batches (segArgs.simple) and sends
-- every other batch to take.lua. Each decision, value, TTL and reply line
-- is byte for byte take.lua's for the same input (TestFastPathAgrees); the
-- values are take.lua's formats, so both scripts (and older releases) read
-- each other's keys.
--
-- KEYS     one state key per segment, in order.
-- ARGV     6 fields per segment: now (integer µs since the Unix epoch, or
--          "" for the server's TIME, read once per invocation), kind (0
--          fixed_window, 1 sliding_window, 3 token_bucket), rate (>= 1),
--          period_us (>= 1), burst (token_bucket; <= 0 means rate), cost
--          (0 .. 2^53).
-- Reply    take.lua's: one line per segment joined by "\n",
--          "<now_us> <allowed 0/1> <remaining> <retry_us> <reset_us>
--          <window_us>", or "!<error>" when that segment failed (nothing of
--          it was written). A malformed layout fails the invocation.
--
-- Cost: the whole script is what Redis re-runs per invocation, so it
-- defines only the few locals it needs; a segment costs its GET (one MGET
-- for a batch) and, when it allowed, one SET ... PX.

local ARGV, KEYS = ARGV, KEYS
local n = #KEYS
if n < 1 or #ARGV ~= 6 * n then
  return redis.error_reply('ERR ratelimitd take1.lua: malformed arguments: length')
end
local floor, max, tonumber, format, find, sub = math.floor, math.max, tonumber, string.format, string.find, string.sub
local call, pcall = redis.call, pcall

-- idiv is exact floor division of integers (take.lua's idiv).
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- the values: nil (not read yet), false (absent) or the string
local vals = {}
if n > 1 then
  -- take.lua's read: one MGET; a key it reports missing is absent only if
  -- EXISTS says none of them exists (else GET each, which fails a
  -- wrong-type key's segment with WRONGTYPE).
  local ok, vs = pcall(call, 'MGET', unpack(KEYS, 1, n))
  if ok then
    local missing, nm = {}, 0
    for i = 1, n do
      local v = vs[i]
      if v then
        vals[KEYS[i]] = v
      else
        nm = nm + 1
        missing[nm] = KEYS[i]
      end
    end
    if nm > 0 then
      local ok2, e = pcall(call, 'EXISTS', unpack(missing, 1, nm))
      if ok2 and e == 0 then
        for i = 1, nm do vals[missing[i]] = false end
      end
    end
  end
end

local server_now
local now, pinned

-- errtext is take.lua's: a caught error as one line.
local function errtext(e)
  if type(e) == 'table' then e = e.err end
  return (string.gsub(tostring(e), '[\r\n]', ' '))
end

-- ttl_ms is take.lua's: the PX of an expiry instant.
local function ttl_ms(at)
  local ms = idiv(at - now + 999, 1000) + 1
  if ms < 1 then ms = 1 end
  if pinned then ms = ms + 1000 end
  return format('%d', ms)
end

-- decide returns the reply text of the hit (after now) and the value to
-- write (nil: nothing) and its expiry instant, for state value v.
local function decide(kind, rate, p, burst, cost, v)
  -- take.lua's parse: the first fields of v, tonumber each
  local a, b, c = 0, 0, 0
  if v then
    local i = find(v, ' ', 1, true)
    if not i then
      a, b, c = tonumber(v), nil, nil
    else
      local j = find(v, ' ', i + 1, true)
      if not j then
        a, b, c = tonumber(sub(v, 1, i - 1)), tonumber(sub(v, i + 1)), nil
      else
        local l = find(v, ' ', j + 1, true)
        if not l then
          a, b, c = tonumber(sub(v, 1, i - 1)), tonumber(sub(v, i + 1, j - 1)), tonumber(sub(v, j + 1))
        else
          a, b, c = tonumber(sub(v, 1, i - 1)), tonumber(sub(v, i + 1, j - 1)), tonumber(sub(v, j + 1, l - 1))
        end
      end
    end
  end
  local need = max(cost, 1)
  if kind == 0 then
    -- fixed_window (take.lua DECIDE[0], SAVE[0]); a = window start, b = count
    local ws = idiv(now, p) * p
    local count = 0
    if a == ws then
      count = b
    elseif a > ws then
      ws = a
      count = b
    end
    local we = idiv(ws, p) * p + p
    local rem = max(rate - count, 0)
    local reset = we - now
    if need > rem then
      return format('0 %d %d %d %d', rem, reset, max(reset, 0), max(reset, 0))
    end
    if cost == 0 then
      return format('1 %d 0 %d %d', rem, max(reset, 0), max(reset, 0))
    end
    return format('1 %d 0 %d %d', max(rem - cost, 0), max(reset, 0), max(reset, 0)),
      format('%d %d', ws, count + cost), we
  elseif kind == 1 then
    -- sliding_window (take.lua DECIDE[1], SAVE[1]); a = window start,
    -- b = count, c = previous window's count
    local ws = idiv(now, p) * p
    local curr, prev = 0, 0
    if a == ws then
      curr, prev = b, c
    elseif a > ws then
      ws = a
      curr, prev = b, c
    else
      if a == ws - p then prev = b end
    end
    local we = idiv(ws, p) * p + p
    local tw = max(now, ws)
    local we2 = idiv(we, p) * p + p
    local function wait(k)
      local t2
      local avail = rate - k - curr
      if avail >= 0 and prev > 0 then
        t2 = we - floor((avail * (we - ws)) / prev)
      elseif curr > 0 then
        t2 = we2 - floor(((rate - k) * (we2 - we)) / curr)
      else
        t2 = now + 1
      end
      return max(t2 - now, 1)
    end
    local rem = max(floor(rate - (prev * ((we - tw) / (we - ws)) + curr)), 0)
    if need > rem then
      local retry = we - now
      if need <= rate then retry = wait(need) end
      local reset = we - now
      if curr > 0 then reset = we2 - now end
      local window = we - now
      if rem < rate then window = wait(rem + 1) end
      return format('0 %d %d %d %d', rem, retry, max(reset, 0), max(window, 0))
    end
    if cost > 0 then
      curr = curr + cost
      rem = rem - cost
    end
    local reset = we - now
    if curr > 0 then reset = we2 - now end
    local window = we - now
    if rem < rate then window = wait(rem + 1) end
    local line = format('1 %d 0 %d %d', max(rem, 0), max(reset, 0), max(window, 0))
    if cost == 0 then return line end
    -- SAVE[1]: curr > 0, so the expiry is the end of the next window
    return line, format('%d %d %d', ws, curr, prev), idiv(we, p) * p + p
  end
  -- token_bucket (take.lua DECIDE[3], SAVE[3]); a = tat_us, b = tat_frac
  local tat, frac = a, b
  local t = now
  local r = rate
  if burst <= 0 then burst = r end
  local q, m = idiv(p, r), p - idiv(p, r) * r
  if frac < 0 or frac >= r then tat, frac = tat + 1, 0 end
  if tat < t then tat, frac = t, 0 end
  local bm = burst * m
  local tauUs, tauFrac = burst * q + idiv(bm, r), bm - idiv(bm, r) * r
  local sUs, sFrac = tauUs - (tat - t), tauFrac - frac
  if sFrac < 0 then
    sFrac = sFrac + r
    sUs = sUs - 1
  end
  local rem = 0
  if sUs >= 0 then rem = idiv(sUs * r + sFrac, p) end
  local function waitFor(k)
    local km = k * m
    local du, df = k * q + idiv(km, r) - sUs, (km - idiv(km, r) * r) - sFrac
    if df < 0 then
      df = df + r
      du = du - 1
    end
    if df > 0 then du = du + 1 end
    return du
  end
  local function fullIn()
    local d = tat - now
    if frac > 0 then d = d + 1 end
    return max(d, 0)
  end
  local function nextw()
    if rem >= burst or fullIn() == 0 then
      if m < 1 then return q + m end
      return q + 1
    end
    return waitFor(rem + 1)
  end
  if need > rem then
    local retry = p
    if need <= burst then retry = waitFor(need) end
    return format('0 %d %d %d %d', max(rem, 0), retry, fullIn(), max(nextw(), 0))
  end
  if cost == 0 then
    return format('1 %d 0 %d %d', max(rem, 0), fullIn(), max(nextw(), 0))
  end
  local nn = frac + cost * m
  tat, frac = tat + cost * q + idiv(nn, r), nn - idiv(nn, r) * r
  sUs, sFrac = tauUs - (tat - t), tauFrac - frac
  if sFrac < 0 then
    sFrac = sFrac + r
    sUs = sUs - 1
  end
  rem = rem - cost
  local line = format('1 %d 0 %d %d', max(rem, 0), fullIn(), max(nextw(), 0))
  local e = tat
  if frac > 0 then e = e + 1 end
  if e <= now then return line, false end -- SAVE[3]: an empty bucket is deleted
  return line, format('%d %d', tat, frac), e
end

-- one decides segment s: its reply line.
local function one(s)
  local o = 6 * (s - 1)
  local nowarg = ARGV[o + 1]
  local kind, rate, p, burst, cost =
    tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4]), tonumber(ARGV[o + 5]), tonumber(ARGV[o + 6])
  if not (kind and rate and p and burst and cost) or (kind ~= 0 and kind ~= 1 and kind ~= 3)
    or rate < 1 or p < 1 or cost < 0 or cost % 1 ~= 0 then
    return '!ERR ratelimitd take1.lua: invalid segment: a field of hit 1'
  end
  if nowarg == '' then
    if not server_now then
      local t = call('TIME')
      server_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
    now, pinned = server_now, false
  else
    now, pinned = tonumber(nowarg), true
    if not now then return '!ERR ratelimitd take1.lua: invalid segment: now' end
  end
  local key = KEYS[s]
  local v = vals[key]
  if v == nil then
    local ok, x = pcall(call, 'GET', key)
    if not ok then return '!' .. errtext(x) end
    v = x
  end
  local ok, text, nv, at = pcall(decide, kind, rate, p, burst, cost, v)
  if not ok then return '!' .. errtext(text) end
  local line = format('%d ', now) .. text
  if nv then
    local ok2, e = pcall(call, 'SET', key, nv, 'PX', ttl_ms(at))
    if not ok2 then return '!' .. errtext(e) end
    vals[key] = nv
  elseif nv == false then
    local ok2, e = pcall(call, 'DEL', key)
    if not ok2 then return '!' .. errtext(e) end
    vals[key] = false
  end
  return line
end

if n == 1 then return one(1) end
local lines = {}
for s = 1, n do lines[s] = one(s) end
return table.concat(lines, '\n')
