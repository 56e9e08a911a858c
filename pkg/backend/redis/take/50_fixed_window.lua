-- fixed_window (pkg/algo/take.go fixedWindow): a = window start, b = count.
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
