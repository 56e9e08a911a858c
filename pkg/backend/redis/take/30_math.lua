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
-- Calendar (pkg/algo/calendar.go) -------------------------------------------
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
