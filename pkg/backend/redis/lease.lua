-- ratelimitd: one lease operation of a leased limit (consistency: leased),
-- atomically: give back unused units of an earlier grant, record the
-- subscriber's demand, and charge up to `want` units up front, as
-- pkg/algo's Lease does (min(want, what a check reports remaining), taken
-- as one allowed take). Every key of a call shares the base key's hash
-- slot ("{base}" or the base's own hash tag).
--
-- KEYS   fixed_window:   count of the window  "<tagged base>:<ws>", demands
--        sliding_window: count of the window, count of the window before,
--                        demands
--        token_bucket:   the bucket (hash: t = TAT µs, f = TAT fraction in
--                        1/rate µs), demands
--        demands is "<tagged base>:d", a hash: "<sub>" = demand,
--        "t<sub>" = when it was reported (µs).
-- Counters a restarted server forgot are assumed the worst (algo's
-- assumeLost, from born: when the server's memory began, now less
-- INFO's uptime_in_seconds): a window that began before born is full, a
-- sliding window's previous window that began before born counts rate,
-- and a token bucket was empty at born. Units leased before a restart
-- may still be in use, so this is what keeps a window within the limit.
--
-- ARGV   now and born ("" for TIME and INFO), kind (0 fixed, 1 sliding, 3 token), rate,
--        period_us, capacity, ws (window start the keys carry; 0 for
--        token), want, ret, ret_ws, sub, demand, stale_us
-- Reply  an array of integers: granted (-1: the keys' window is not the
--        server's, nothing written), remaining after the grant, now_us,
--        then sub, demand per subscriber reported within stale_us.
local ARGV, KEYS = ARGV, KEYS
local call, tonumber, min, max, floor = redis.call, tonumber, math.min, math.max, math.floor
local now, born
-- grace (ms) is added to every TTL: a second, and an hour more when the
-- caller pins now (tests), since Redis expires keys by real time, which
-- a pinned clock does not follow.
local grace = 1000
if ARGV[1] == '' then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local up = string.match(call('INFO', 'server'), 'uptime_in_seconds:(%d+)')
  born = now - tonumber(up) * 1000000
else
  now, born = tonumber(ARGV[1]), tonumber(ARGV[2])
  grace = 3601000
end
local kind, rate, period, cap = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local ws, want, ret, retws = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local sub, demand, stale = ARGV[11], tonumber(ARGV[12]), tonumber(ARGV[13])
local dkey = KEYS[#KEYS]

if kind ~= 3 and now - now % period ~= ws then
  return { -1, 0, now }
end

local granted, rem = 0, 0
if kind == 0 then
  local key = KEYS[1]
  local count = tonumber(call('GET', key)) or 0
  if ret > 0 and retws == ws and count > 0 then
    local back = min(ret, count)
    count = count - back
    call('DECRBY', key, back)
  end
  local seen = count
  if ws < born then seen = max(count, rate) end
  rem = max(rate - seen, 0)
  granted = min(want, rem)
  if granted > 0 then
    call('INCRBY', key, granted)
    call('PEXPIRE', key, floor((ws + period - now) / 1000) + grace)
    rem = rem - granted
  end
elseif kind == 1 then
  local key, pkey = KEYS[1], KEYS[2]
  local curr = tonumber(call('GET', key)) or 0
  local prev = tonumber(call('GET', pkey)) or 0
  if ret > 0 and retws == ws and (curr > 0 or prev > 0) then
    -- algo's creditSliding: from this window's count, the rest from the
    -- window before, each floored at 0.
    local c = max(curr - ret, 0)
    local p = max(prev - (ret - (curr - c)), 0)
    if c ~= curr then call('DECRBY', key, curr - c) end
    if p ~= prev then call('DECRBY', pkey, prev - p) end
    curr, prev = c, p
  end
  -- algo's swin.remaining: w = (we - tw) / (we - ws), est = prev*w + curr
  local we = ws + period
  local w = (we - now) / (we - ws)
  local c, p = curr, prev
  if ws < born then
    c = max(curr, rate)
  elseif ws - period < born then
    p = max(prev, rate)
  end
  rem = max(floor(rate - (p * w + c)), 0)
  granted = min(want, rem)
  if granted > 0 then
    call('INCRBY', key, granted)
    call('PEXPIRE', key, floor((we + period - now) / 1000) + grace)
    rem = rem - granted
  end
else
  -- GCRA as algo's tokenBucket: T = q + m/rate µs per token.
  local key = KEYS[1]
  local q, m = floor(period / rate), period % rate
  local v = call('HMGET', key, 't', 'f')
  local tat, f = tonumber(v[1]) or 0, tonumber(v[2]) or 0
  if f < 0 or f >= rate then tat, f = tat + 1, 0 end
  if ret > 0 and tat >= now then
    -- algo's creditToken: the TAT moves back by ret*T, in steps of the
    -- capacity, never before now.
    local n = ret
    for _ = 1, 2 do
      if n <= 0 then break end
      local k = min(n, cap)
      n = n - k
      tat, f = tat - (k * q + floor(k * m / rate)), f - (k * m) % rate
      if f < 0 then f, tat = f + rate, tat - 1 end
      if tat < now then break end
    end
  end
  local tauUs, tauF = cap * q + floor(cap * m / rate), (cap * m) % rate
  if born > 0 and (tat < born + tauUs or (tat == born + tauUs and f < tauF)) then
    tat, f = born + tauUs, tauF
  end
  if tat < now then tat, f = now, 0 end
  local sUs, sF = tauUs - (tat - now), tauF - f
  if sF < 0 then sF, sUs = sF + rate, sUs - 1 end
  if sUs >= 0 then rem = floor((sUs * rate + sF) / period) end
  granted = min(want, rem)
  if granted > 0 then
    local n = f + granted * m
    tat, f = tat + granted * q + floor(n / rate), n % rate
    rem = rem - granted
  end
  if granted > 0 or ret > 0 then
    call('HSET', key, 't', tat, 'f', f)
    call('PEXPIRE', key, floor((tat - now) / 1000) + grace)
  end
end

call('HSET', dkey, sub, demand, 't' .. sub, now)
call('PEXPIRE', dkey, floor(stale / 1000) + grace)
local all = call('HGETALL', dkey)
local at, dem = {}, {}
for i = 1, #all, 2 do
  local f, val = all[i], tonumber(all[i + 1])
  if string.sub(f, 1, 1) == 't' then
    at[string.sub(f, 2)] = val
  else
    dem[f] = val
  end
end
local out = { granted, rem, now }
for id, d in pairs(dem) do
  local t = at[id]
  if t == nil or now - t > stale then
    call('HDEL', dkey, id, 't' .. id)
  else
    out[#out + 1] = tonumber(id)
    out[#out + 1] = d
  end
end
return out
