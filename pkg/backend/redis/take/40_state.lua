-- Helpers ---------------------------------------------------------------------

local function fmt(n)
  return format('%d', n)
end

-- ttl_ms turns an expiry instant into a PX value: rounded up to the ms,
-- plus 1 ms because Redis adds PX to its command-start time in whole ms
-- (up to 1 ms before TIME). A pinned clock (tests) has no relation to the
-- real time Redis expires keys by: an hour of slack (pinnedSlackMs in
-- lean.go) keeps the real time that passes between a test's steps, however
-- starved the host, from expiring a key the pinned clock still needs.
local function ttl_ms(at)
  local us = at - now
  local ms = idiv(us + 999, 1000) + 1
  if ms < 1 then ms = 1 end
  if pinned then ms = ms + 3600000 end
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
