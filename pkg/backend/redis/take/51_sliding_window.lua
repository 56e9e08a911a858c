-- sliding_window (pkg/algo/take.go slidingWindow, swin): a = window start, b =
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
