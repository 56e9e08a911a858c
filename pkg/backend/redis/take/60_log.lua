-- sliding_log and concurrency (pkg/algo/take.go timestampLog, release1) -----
local log_save
if used[2] or used[4] then
  -- The state is the live part of the sorted set (scores > now - period),
  -- read lazily: n0 live entries in Redis of which `dropped` oldest are
  -- released and `cut` newest are credited back (sliding_log), then the
  -- `added` timestamps of this request (all >= the newest live entry, so
  -- the order is the sorted set's).
  local function log_len(st) return st.n0 - st.dropped - st.cut + #st.added end

  -- log_at returns the i-th (1-based) live timestamp.
  local function log_at(st, i)
    local j = i + st.dropped
    if j <= st.n0 - st.cut then
      local rank = st.off + j - 1
      local v = st.memo[rank] -- ranks are stable until the script writes
      if not v then
        local r = redis.call('ZRANGE', st.key, fmt(rank), fmt(rank), 'WITHSCORES')
        v = tonumber(r[2])
        st.memo[rank] = v
      end
      return v
    end
    return st.added[j - (st.n0 - st.cut)]
  end

  local function log_decision(d, st, p)
    local n = log_len(st)
    if n > 0 then
      d.reset = log_at(st, n) + p - now
      d.window = log_at(st, 1) + p - now
    else
      d.window = p
    end
    return d
  end

  local function log_copy(st)
    local a = {}
    for i, x in ipairs(st.added) do a[i] = x end
    return {
      key = st.key, off = st.off, n0 = st.n0, dropped = st.dropped, cut = st.cut, added = a, dirty = st.dirty,
      memo = st.memo,
    }
  end

  local LOG = {
    load = function(h)
      local cut = now - h.period
      local total = redis.call('ZCARD', h.key)
      local off, n0 = 0, 0
      if total > 0 then
        off = redis.call('ZCOUNT', h.key, '-inf', fmt(cut))
        n0 = total - off
      end
      return { key = h.key, off = off, n0 = n0, dropped = 0, cut = 0, added = {}, memo = {} }
    end,
    decide = function(h, st, cost)
      local p = h.period
      local rem = max(h.rate - log_len(st), 0)
      local need = max(cost, 1)
      if need > rem and h.charge and cost > 0 and h.kind == 2 then
        -- always_charge (sliding_log): the log grows to at most 2*rate
        local n = log_len(st)
        local k = min(cost, 2 * h.rate - n)
        if k > 0 then
          local ns = log_copy(st)
          local ts = now
          if n > 0 then ts = max(ts, log_at(st, n)) end
          for _ = 1, k do ns.added[#ns.added + 1] = ts end
          ns.dirty = true
          st = ns
          rem = max(h.rate - log_len(st), 0)
        end
      end
      if need > rem then
        local retry = p
        if need <= h.rate then
          local e = log_len(st) + need - h.rate
          retry = log_at(st, e) + p - now
        end
        return st, log_decision(dec(false, rem, retry), st, p)
      end
      if cost == 0 then
        return st, log_decision(dec(true, rem), st, p)
      end
      local ns = log_copy(st)
      local ts = now
      local n = log_len(st)
      if n > 0 then ts = max(ts, log_at(st, n)) end
      for _ = 1, cost do ns.added[#ns.added + 1] = ts end
      ns.dirty = true
      ns.hit = h.idx
      ns.marks = ns.marks or {}
      return ns, log_decision(dec(true, rem - cost), ns, p)
    end,
    release = function(h, st, n)
      local p = h.period
      local ns = st
      if n > 0 then
        ns = log_copy(st)
        local k = min(n, log_len(ns))
        local fromRedis = min(k, ns.n0 - ns.dropped - ns.cut)
        ns.dropped = ns.dropped + fromRedis
        for _ = 1, k - fromRedis do table.remove(ns.added, 1) end
        ns.dirty = true
      end
      local rem = max(h.rate - log_len(ns), 0)
      return ns, log_decision(dec(true, rem), ns, p)
    end,
    -- credit drops the n newest live entries (take.go creditLog): this
    -- request's additions first, then the newest in Redis.
    credit = function(_, st, n)
      local k = min(n, log_len(st))
      if k <= 0 then return st end
      local ns = log_copy(st)
      local fromAdded = min(k, #ns.added)
      for _ = 1, fromAdded do ns.added[#ns.added] = nil end
      ns.cut = ns.cut + (k - fromAdded)
      ns.dirty = true
      return ns
    end,
  }

  -- Members of added timestamps: nonce.hit.unit, unique per request and hit.
  -- `owner` records, per added timestamp, the hit index that added it.
  log_save = function(h, st, members)
    local cut = now - h.period
    local n = log_len(st)
    local last
    if n > 0 then last = log_at(st, n) end -- read before the ranks shift
    cache[h.key] = nil -- no longer a known string value
    if st.off > 0 then redis.call('ZREMRANGEBYSCORE', h.key, '-inf', fmt(cut)) end
    if st.dropped > 0 then redis.call('ZREMRANGEBYRANK', h.key, '0', fmt(st.dropped - 1)) end
    if st.cut > 0 then redis.call('ZREMRANGEBYRANK', h.key, fmt(-st.cut), '-1') end
    -- ZADD in batches: unpack() of more than LUAI_MAXCSTACK (8000) values
    -- fails, and a request may add up to MaxSlidingLogRate members.
    local args = {}
    for i = 1, #members do
      args[#args + 1] = fmt(st.added[i])
      args[#args + 1] = members[i]
      if #args >= 1000 or i == #members then
        redis.call('ZADD', h.key, unpack(args))
        args = {}
      end
    end
    if n == 0 then
      redis.call('DEL', h.key)
      return
    end
    redis.call('PEXPIRE', h.key, ttl_ms(last + h.period))
  end

  K[2] = LOG
  K[4] = LOG
end
