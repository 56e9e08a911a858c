-- fast_segment is segment for a take of string kinds on distinct keys
-- (seg.fast): each hit loads, decides and saves its own key once, so the
-- states are plain numbers and no per-hit table is built. Same phases.
-- A, B, C hold the states before the request, NA, NB, NC the new ones
-- (AL: allowed, CH: changed), R the hits' reply texts; reused by every segment.
local A, B, C, NA, NB, NC, AL, CH, R = {}, {}, {}, {}, {}, {}, {}, {}, {}
local function fast_segment(seg)
  local hits = seg.hits
  local n = #hits
  for i = 1, n do
    A[i], B[i], C[i] = parse(sget(hits[i].key))
  end
  local denied = false
  local kept = false
  for i = 1, n do
    local h = hits[i]
    local al, rem, retry, reset, window, changed, a, b, c = sdecide(h, A[i], B[i], C[i], h.cost)
    if not al and not h.soft then denied = true end
    if h.release or h.charge then kept = true end
    AL[i], CH[i], NA[i], NB[i], NC[i] = al, changed, a, b, c
    R[i] = hit_text(al, rem, retry, reset, window)
  end
  if denied then
    -- Only the kept hits (release, charge) are written: on distinct keys
    -- their replay is this pass. The other hits that did not deny report
    -- the value before the request: a check (cost 0) on the state before it.
    for i = 1, n do
      local h = hits[i]
      if not (h.release or h.charge) then
        if AL[i] then R[i] = hit_text(sdecide(h, A[i], B[i], C[i], 0)) end
        CH[i] = false
      end
    end
  end
  local line
  if n == 1 then
    line = now_text() .. ' ' .. R[1]
  else
    R[0] = now_text()
    line = concat(R, ' ', 0, n)
  end
  if denied and not kept then return line end
  for i = 1, n do
    if CH[i] then
      local h = hits[i]
      SAVE[h.kind](h, NA[i], NB[i], NC[i])
    end
  end
  return line
end
