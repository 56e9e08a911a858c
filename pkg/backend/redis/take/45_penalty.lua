-- Penalty box --------------------------------------------------------------
-- algo.Hit.Penalty (pkg/algo/penalty.go: applyPenalty). A hit's box is
-- the string h.pkey "<denials> <denials_end_us> <block_end_us>" (a
-- missing key is 0 0 0), with a TTL until both ends have passed. It is
-- written only when a denial counts or a block starts or is extended.

-- pload reads h's box: { d = denials, de = denials end, be = block end }.
local function pload(h)
  local d, de, be = parse(sget(h.pkey))
  return { d = d or 0, de = de or 0, be = be or 0 }
end

-- psave writes box ps of h, or deletes it when both ends have passed.
local function psave(h, ps)
  local at = max(ps.de, ps.be)
  if at <= now then
    sdel(h.pkey)
  else
    sset(h.pkey, format('%d %d %d', ps.d, ps.de, ps.be), at)
  end
end

-- penalize is applyPenalty for hit h (h.pen) with box ps: when a block is
-- in force it returns the blocked decision and the box (extended with
-- h.extend) without deciding the limit (decide is not called); else
-- decide() decides the limit and a denial is counted, the h.after-th
-- starting a block. It returns the decision, the new box (dirty when it
-- must be written) and whether the limit was decided.
local function penalize(h, ps, decide)
  if ps.be > now then
    local w = ps.be - now
    if h.extend and now + h.block > ps.be then
      ps = { d = ps.d, de = ps.de, be = now + h.block, dirty = true }
      w = h.block
    end
    local d = dec(false, 0, w, w, w)
    d.pen = 3
    return d, ps, false
  end
  local d = decide()
  -- an allowed hit leaves the box as it is (nothing to write)
  if d.allowed then return d, ps, true end
  local np = { d = ps.d, de = ps.de, be = ps.be }
  if np.de <= now then np.d, np.de = 0, 0 end -- a new count window
  if np.d == 0 then np.de = now + h.within end
  np.d = np.d + 1
  np.dirty = true
  if np.d < h.after then return d, np, true end
  np.d, np.de, np.be = 0, 0, now + h.block
  d = dec(false, 0, h.block, h.block, h.block)
  d.pen = 2
  return d, np, true
end
