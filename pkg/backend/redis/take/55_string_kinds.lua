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
