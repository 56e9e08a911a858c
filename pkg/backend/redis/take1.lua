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
-- Cost (measured with callgrind, BENCHMARKS.md "Redis store"): Redis
-- re-runs the whole chunk per invocation, and in its Lua 5.1 every C
-- call is dear (tonumber of a string, string.format of a number ≈ 1.5–2k
-- instructions each; a closure or a table ≈ 0.5–1k; SET ... PX ≈ 10k), so
-- the chunk defines one function (the segment, run under pcall so that a
-- failing segment fails alone), converts only the fields its kind uses
-- (kind and a cost of 1 are compared as strings) and formats each reply
-- line with one string.format.

local ARGV, KEYS = ARGV, KEYS
local n = #KEYS
if n < 1 or #ARGV ~= 6 * n then
  return redis.error_reply('ERR ratelimitd take1.lua: malformed arguments: length')
end
local floor, tonumber, format, find, sub = math.floor, tonumber, string.format, string.find, string.sub
local call = redis.call

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

local server_now, server_text -- TIME, read once per invocation
local now, nowtext, pinned

-- one decides segment s and returns its reply line; it raises the Redis or
-- Lua error that fails the segment (caught below). Arithmetic is
-- take.lua's, in the same order (idiv: floor division corrected to exact;
-- max(x, 0) as comparisons).
local function one(s)
  local o = 6 * (s - 1)
  local nowarg, kind, cs = ARGV[o + 1], ARGV[o + 2], ARGV[o + 6]
  local rate, p = tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4])
  local cost = 1
  if cs ~= '1' then cost = tonumber(cs) end
  if not (rate and p and cost) or (kind ~= '0' and kind ~= '1' and kind ~= '3')
    or rate < 1 or p < 1 or cost < 0 or cost % 1 ~= 0 then
    return '!ERR ratelimitd take1.lua: invalid segment: a field of hit 1'
  end
  if nowarg == '' then
    if not server_now then
      local t = call('TIME')
      server_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
      server_text = format('%d', server_now)
    end
    now, nowtext, pinned = server_now, server_text, false
  else
    now, pinned = tonumber(nowarg), true
    if not now then return '!ERR ratelimitd take1.lua: invalid segment: now' end
    nowtext = format('%d', now)
  end
  local key = KEYS[s]
  local v = vals[key]
  if v == nil then v = call('GET', key) end
  -- take.lua's parse: the first three space-separated fields, tonumber each
  local a, b, c = 0, 0, 0
  if v then
    local i = find(v, ' ', 1, true)
    if not i then
      a, b, c = tonumber(v), nil, nil
    else
      local j = find(v, ' ', i + 1, true)
      if not j then
        a, b, c = tonumber(sub(v, 1, i - 1)), tonumber(sub(v, i + 1)), nil
      elseif kind == '0' then -- a fixed window reads two fields
        a, b = tonumber(sub(v, 1, i - 1)), tonumber(sub(v, i + 1, j - 1))
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
  local need = cost
  if need < 1 then need = 1 end
  local nv, at -- the value to write (false: delete) and its expiry instant
  local line
  if kind == '0' then
    -- fixed_window (take.lua DECIDE[0], SAVE[0]); a = window start, b = count
    local q = floor(now / p)
    if q * p > now then q = q - 1 elseif (q + 1) * p <= now then q = q + 1 end
    local ws = q * p
    local count = 0
    if a == ws then
      count = b
    elseif a > ws then
      ws = a
      count = b
      q = floor(ws / p)
      if q * p > ws then q = q - 1 elseif (q + 1) * p <= ws then q = q + 1 end
    end
    local we = q * p + p
    local rem = rate - count
    if rem < 0 then rem = 0 end
    local reset = we - now
    local r0 = reset
    if r0 < 0 then r0 = 0 end
    if need > rem then
      return format('%s 0 %d %d %d %d', nowtext, rem, reset, r0, r0)
    end
    if cost == 0 then
      return format('%s 1 %d 0 %d %d', nowtext, rem, r0, r0)
    end
    line = format('%s 1 %d 0 %d %d', nowtext, rem - cost, r0, r0)
    nv, at = format('%d %d', ws, count + cost), we
  elseif kind == '1' then
    -- sliding_window (take.lua DECIDE[1], SAVE[1]); a = window start,
    -- b = count, c = previous window's count
    local q = floor(now / p)
    if q * p > now then q = q - 1 elseif (q + 1) * p <= now then q = q + 1 end
    local ws = q * p
    local curr, prev = 0, 0
    if a == ws then
      curr, prev = b, c
    elseif a > ws then
      ws = a
      curr, prev = b, c
      q = floor(ws / p)
      if q * p > ws then q = q - 1 elseif (q + 1) * p <= ws then q = q + 1 end
    else
      if a == ws - p then prev = b end
    end
    local we = q * p + p
    local tw = now
    if ws > tw then tw = ws end
    local q2 = floor(we / p)
    if q2 * p > we then q2 = q2 - 1 elseif (q2 + 1) * p <= we then q2 = q2 + 1 end
    local we2 = q2 * p + p
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
      local d = t2 - now
      if d < 1 then d = 1 end
      return d
    end
    local rem = floor(rate - (prev * ((we - tw) / (we - ws)) + curr))
    if rem < 0 then rem = 0 end
    local al = 1
    local retry = 0
    if need > rem then
      al = 0
      retry = we - now
      if need <= rate then retry = wait(need) end
    elseif cost > 0 then
      curr = curr + cost
      rem = rem - cost
    end
    local reset = we - now
    if curr > 0 then reset = we2 - now end
    if reset < 0 then reset = 0 end
    local window = we - now
    if rem < rate then window = wait(rem + 1) end
    if window < 0 then window = 0 end
    line = format('%s %d %d %d %d %d', nowtext, al, rem, retry, reset, window)
    if al == 0 or cost == 0 then return line end
    -- SAVE[1]: curr > 0, so the expiry is the end of the next window (we2)
    nv, at = format('%d %d %d', ws, curr, prev), we2
  else
    -- token_bucket (take.lua DECIDE[3], SAVE[3]); a = tat_us, b = tat_frac
    local burst = tonumber(ARGV[o + 5])
    if not burst then return '!ERR ratelimitd take1.lua: invalid segment: a field of hit 1' end
    local tat, frac = a, b
    local t = now
    local r = rate
    if burst <= 0 then burst = r end
    local q = floor(p / r)
    if q * r > p then q = q - 1 elseif (q + 1) * r <= p then q = q + 1 end
    local m = p - q * r
    if frac < 0 or frac >= r then tat, frac = tat + 1, 0 end
    if tat < t then tat, frac = t, 0 end
    local bm = burst * m
    local qb = floor(bm / r)
    if qb * r > bm then qb = qb - 1 elseif (qb + 1) * r <= bm then qb = qb + 1 end
    local tauUs, tauFrac = burst * q + qb, bm - qb * r
    local sUs, sFrac = tauUs - (tat - t), tauFrac - frac
    if sFrac < 0 then
      sFrac = sFrac + r
      sUs = sUs - 1
    end
    local function idiv(x, y)
      local z = floor(x / y)
      if z * y > x then z = z - 1 elseif (z + 1) * y <= x then z = z + 1 end
      return z
    end
    local rem = 0
    if sUs >= 0 then rem = idiv(sUs * r + sFrac, p) end
    local function waitFor(k)
      local km = k * m
      local qk = idiv(km, r)
      local du, df = k * q + qk - sUs, (km - qk * r) - sFrac
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
      if d < 0 then d = 0 end
      return d
    end
    local function nextw()
      local w
      if rem >= burst or fullIn() == 0 then
        if m < 1 then w = q + m else w = q + 1 end
      else
        w = waitFor(rem + 1)
      end
      if w < 0 then w = 0 end
      return w
    end
    if need > rem then
      local retry = p
      if need <= burst then retry = waitFor(need) end
      if rem < 0 then rem = 0 end
      return format('%s 0 %d %d %d %d', nowtext, rem, retry, fullIn(), nextw())
    end
    if cost == 0 then
      if rem < 0 then rem = 0 end
      return format('%s 1 %d 0 %d %d', nowtext, rem, fullIn(), nextw())
    end
    local nn = frac + cost * m
    local qn = idiv(nn, r)
    tat, frac = tat + cost * q + qn, nn - qn * r
    sUs, sFrac = tauUs - (tat - t), tauFrac - frac
    if sFrac < 0 then
      sFrac = sFrac + r
      sUs = sUs - 1
    end
    rem = rem - cost
    local w = nextw()
    local r0 = rem
    if r0 < 0 then r0 = 0 end
    line = format('%s 1 %d 0 %d %d', nowtext, r0, fullIn(), w)
    local e = tat
    if frac > 0 then e = e + 1 end
    if e <= now then -- SAVE[3]: an empty bucket is deleted
      call('DEL', key)
      vals[key] = false
      return line
    end
    nv, at = format('%d %d', tat, frac), e
  end
  -- take.lua's ttl_ms: the PX of the expiry instant
  local us = at - now + 999
  local ms = floor(us / 1000)
  if ms * 1000 > us then ms = ms - 1 elseif (ms + 1) * 1000 <= us then ms = ms + 1 end
  ms = ms + 1
  if ms < 1 then ms = 1 end
  if pinned then ms = ms + 3600000 end -- pinnedSlackMs (lean.go)
  call('SET', key, nv, 'PX', format('%d', ms))
  vals[key] = nv
  return line
end

-- run is one under pcall: its line, or "!" and the error (take.lua's
-- errtext: a Redis error reply or a Lua error message, on one line).
local function run(s)
  local ok, line = pcall(one, s)
  if ok then return line end
  local e = line
  if type(e) == 'table' then e = e.err end
  return '!' .. (string.gsub(tostring(e), '[\r\n]', ' '))
end

if n == 1 then return run(1) end
local lines = {}
for s = 1, n do lines[s] = run(s) end
return table.concat(lines, '\n')
