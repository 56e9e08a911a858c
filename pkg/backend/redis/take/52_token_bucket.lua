-- token_bucket (pkg/algo/take.go tokenBucket): GCRA with an exact rational TAT;
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
