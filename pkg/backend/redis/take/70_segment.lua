-- Main ----------------------------------------------------------------------

-- apply is algo.Apply / decide: release, rate 0, then the kind.
local function apply(h, st, cost)
  local k = K[h.kind]
  if h.release then
    if h.kind == 4 then return k.release(h, st, cost) end
    -- a credit, then a check on the credited state, allowed
    if h.rate <= 0 then
      local w = rate0_window(h)
      return st, dec(true, 0, 0, w, w)
    end
    local ns = st
    if cost > 0 then ns = k.credit(h, st, cost) end
    local _, d = k.decide(h, ns, 0)
    d.allowed, d.retry = true, 0
    return ns, d
  end
  if h.rate <= 0 then
    local w = rate0_window(h)
    return st, dec(false, 0, w, w, w)
  end
  return k.decide(h, st, cost)
end

-- check is the decision of a check (cost 0, not a release) of h on st:
-- the value before the request (algo.Take(l, st, now, 0)).
local function check(h, st)
  local c = {}
  for k, v in pairs(h) do c[k] = v end
  c.release = false
  local _, d = apply(c, st, 0)
  return d
end

-- nowstr is fmt(now), formatted once per distinct instant.
local nowstr, nowstr_of = '', nil
local function now_text()
  if nowstr_of ~= now then
    nowstr, nowstr_of = fmt(now), now
  end
  return nowstr
end

-- hit_text is a hit's part of a reply line: 5 integers.
-- allowed is a boolean, or a penalty box's reply code (2 started, 3
-- blocked).
local function hit_text(allowed, rem, retry, reset, window)
  local a = 0
  if allowed == true then a = 1 elseif allowed then a = allowed end
  return format('%d %d %d %d %d', a, max(rem, 0), retry, max(reset, 0), max(window, 0))
end

-- reply is the segment's line: now, then 5 integers per hit.
local function reply(decisions)
  local out = { now_text() }
  for i, d in ipairs(decisions) do
    out[i + 1] = hit_text(d.pen or d.allowed, d.rem, d.retry, d.reset, d.window)
  end
  return concat(out, ' ')
end

-- refund reverses a take (mode "r"): each hit in reverse order, then the
-- check-only decisions on the restored state (the values before the take).
-- Every refunded state is computed before the first write.
local function refund(seg, hits, states, first)
  local zrem = {}
  for i = #hits, 1, -1 do
    local h = hits[i]
    if h.cost > 0 and not h.release and h.rate > 0 then
      if h.kind == 2 or h.kind == 4 then
        for j = 1, h.cost do
          zrem[#zrem + 1] = h.key
          zrem[#zrem + 1] = seg.nonce .. '.' .. h.idx .. '.' .. j
        end
      else
        states[h.key] = K[h.kind].refund(h, states[h.key], h.cost)
      end
    end
  end
  for j = 1, #zrem, 2 do
    cache[zrem[j]] = nil
    call('ZREM', zrem[j], zrem[j + 1])
  end
  for _, h in ipairs(first) do
    local st = states[h.key]
    if st.dirty then K[h.kind].save(h, st) end
  end
  local decisions = {}
  for i, h in ipairs(hits) do
    decisions[i] = check(h, K[h.kind].load(h))
  end
  return reply(decisions)
end

-- segment decides one segment and returns its reply line. Phase 1 (loads
-- and decisions) only reads; phase 2 writes, and only when it allowed.
local function segment(seg)
  local hits = seg.hits
  local states = {}   -- key -> current (tentative) state
  local initial = {}  -- key -> state before the request
  local first = {}    -- keys in first-use order, with the hit that loaded them
  local members = {}  -- key -> list of new log members, in added order

  for _, h in ipairs(hits) do
    if not states[h.key] then
      local st = K[h.kind].load(h)
      states[h.key] = st
      initial[h.key] = st
      first[#first + 1] = h
      members[h.key] = {}
    end
  end

  if seg.mode == 'r' then return refund(seg, hits, states, first) end

  -- boxes: penalty box key -> box (45_penalty.lua), of the hits with one
  local boxes, pinitial, pfirst = {}, {}, {}
  for _, h in ipairs(hits) do
    if h.pen and not boxes[h.pkey] then
      local ps = pload(h)
      boxes[h.pkey], pinitial[h.pkey] = ps, ps
      pfirst[#pfirst + 1] = h
    end
  end

  -- step applies hit h to states (and its new log members to members),
  -- within its penalty box in boxes.
  local function step(h, states, members, boxes)
    local st = states[h.key]
    local ns, d
    if h.pen then
      local np
      d, np = penalize(h, boxes[h.pkey], function()
        local d1
        ns, d1 = apply(h, st, h.cost)
        return d1
      end)
      boxes[h.pkey] = np
      ns = ns or st
    else
      ns, d = apply(h, st, h.cost)
    end
    if (h.kind == 2 or h.kind == 4) and ns ~= st and #ns.added > #st.added then
      local ms = members[h.key]
      for j = 1, #ns.added - #st.added do
        ms[#ms + 1] = seg.nonce .. '.' .. h.idx .. '.' .. j
      end
    end
    states[h.key] = ns
    return d
  end

  local decisions = {}
  local after = {} -- each penalized hit's box after it
  local denied = seg.mode == 'd' -- denied by another segment of its request
  for i, h in ipairs(hits) do
    local d = step(h, states, members, boxes)
    if not d.allowed and not h.soft then denied = true end
    decisions[i] = d
    if h.pen then after[i] = boxes[h.pkey] end
  end

  if denied then
    -- Replay on the states before the request with only the kept hits
    -- (release, charge): they are written; the other hits that did not
    -- deny report a check at their place (algotest.Reference).
    -- A penalized hit that denied keeps its box (algo.KeepPenalty).
    local kept = false
    states, members, boxes = {}, {}, {}
    for key, st in pairs(initial) do
      states[key] = st
      members[key] = {}
    end
    for key, ps in pairs(pinitial) do boxes[key] = ps end
    for i, h in ipairs(hits) do
      if h.release or h.charge then
        decisions[i] = step(h, states, members, boxes)
        kept = true
      elseif decisions[i].allowed then
        decisions[i] = check(h, states[h.key])
      elseif h.pen then
        local ps = after[i]
        boxes[h.pkey] = { d = ps.d, de = ps.de, be = ps.be, dirty = true }
        kept = true
      end
    end
    if not kept then return reply(decisions) end
  end
  local line = reply(decisions)
  for _, h in ipairs(first) do
    local st = states[h.key]
    if st.dirty then
      if h.kind == 2 or h.kind == 4 then
        -- a release may have dropped added entries: keep the newest members
        local ms = members[h.key]
        local extra = #ms - #st.added
        local keep = {}
        for j = extra + 1, #ms do keep[#keep + 1] = ms[j] end
        log_save(h, st, keep)
      else
        K[h.kind].save(h, st)
      end
    end
  end
  for _, h in ipairs(pfirst) do
    local ps = boxes[h.pkey]
    if ps.dirty then psave(h, ps) end
  end
  return line
end
