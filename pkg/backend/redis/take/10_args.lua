-- ratelimitd: decide a batch of requests ("segments") in one invocation.
-- Each segment is the hits of one request (or of one Cluster slot group of
-- a request), decided atomically and all-or-nothing exactly as if it were
-- the only one; segments run in order, so a later segment sees an earlier
-- one's writes. A line-by-line port of pkg/algo (take.go, calendar.go); the
-- protocol is below.
--
-- KEYS     the state keys of every hit of every segment, in order. One key
--          per hit and never a derived key: every key the script touches is
--          declared, so Cluster slot routing is exact (a Cluster batch only
--          holds segments of one slot).
-- ARGV[1]  S, the number of segments (>= 1). Then per segment:
--   mode   "t" take, "r" refund (reverse a previous take exactly and reply
--          with check-only decisions on the restored state), "d" denied (a
--          take whose request another segment already denied: decided and
--          written as a take that denied, so only its kept hits are
--          written; Cluster, the groups after a denying one).
--   now    integer microseconds since the Unix epoch, or "" for the
--          server's TIME (read once per invocation). Tests pin it; refunds
--          pass the take's now.
--   nonce  request nonce: makes log members unique across requests.
--   n      number of hits of the segment (>= 0), followed by n × NF fields:
--          kind, rate, period_us, burst, calendar, multiplier, cost, flags
--          (a sum of 1 = release: return cost units, algo.Release; 2 =
--          soft: a denial does not deny the request; 4 = charge: the
--          always_charge counting policy, algo.Charge; 8 = penalty: the
--          hit has a penalty box, algo.Hit.Penalty, and 3 more fields
--          follow: after, within_us, block_us; 16 = extend, with 8:
--          algo.Penalty.Extend). A hit with a penalty box has a second
--          key right after its own in KEYS: its box's key (see
--          45_penalty.lua), in the same hash slot. cost is at most
--          2^53 (algo.MaxCost, above every limit's capacity: always
--          denied). A release or charge hit is kept when its segment is
--          denied (algo.Hit.Kept; see algotest.Reference).
--
-- Reply: one bulk string, one line per segment, lines joined by "\n":
--   "<now_us> then per hit: <allowed> <remaining> <retry_us>
--    <reset_us> <window_us>" (integers separated by one space), or
--   allowed is 1 allowed, 0 denied, 2 denied and a penalty block started
--   (algo.PenaltyStarted), 3 denied by a block (algo.PenaltyBlocked);
--   "!<error>" when that segment failed (nothing of it was written; see
--          Errors). Durations are integer microseconds.
--
-- Errors. A malformed ARGV/KEYS layout (segment count, a segment header,
-- the number of KEYS or ARGV) fails the whole invocation before anything
-- is read or written. A segment whose now or hit fields are out of range
-- (an integer outside its bounds; a cost outside [-2^53, 2^53]) is
-- rejected on its own: its line is "!ERR ratelimitd take.lua: invalid
-- segment: <field> of hit <i>" (or "...: now"), nothing of it is read or
-- written, and the other segments are decided. Each segment runs under
-- pcall in two phases: (1) reads and decisions, no write; (2) writes, only
-- when it allowed. An error in phase 1 (e.g. WRONGTYPE, a corrupted value) becomes
-- that segment's "!" line and nothing of it is written. In phase 2 the
-- only errors Redis can raise are write refusals (OOM under noeviction,
-- READONLY, MISCONF, NOREPLICAS), and Redis raises those only before the
-- first write of an invocation (a script that already wrote is never
-- failed on server state): such a segment wrote nothing either. Redis does
-- not roll scripts back, so this split is what keeps a failing segment
-- from leaving partial writes or affecting the others.
--
-- Values (all instants in µs since the epoch):
--   fixed_window    string "<window_start> <count>"
--   sliding_window  string "<window_start> <count> <prev_count>"
--   token_bucket    string "<tat_us> <tat_frac>" (TAT = tat_us + frac/rate)
--   sliding_log,
--   concurrency     sorted set, score = timestamp, member = nonce.hit.unit
-- Every write sets a TTL equal to the time until the state is empty again
-- (algo.ExpiresAtUs - now); an empty state deletes the key.
--
-- Numbers are Lua doubles; pkg/algo keeps every integer below 2^53 and
-- uses only +, -, *, floor division and the same float operations in the
-- same order, so results are bit-identical.

-- Cost (BENCHMARKS.md, "Redis store: batching, script cost, memory"). Most of a segment's time in Redis
-- is its redis.calls; the Lua around them is kept small: the string kinds
-- (fixed_window, sliding_window, token_bucket) keep their state as plain
-- numbers, not tables; a take segment of string kinds on distinct keys
-- (the common case) runs a direct path without per-hit decision tables;
-- the values of every string key of the invocation are read with one MGET
-- up front (a key MGET reports missing is confirmed absent with one
-- EXISTS, or read with its own GET, so a wrong-type key still fails its
-- own segment with WRONGTYPE); a value this script wrote is remembered,
-- so a later segment reads it without a call. Numbers are formatted with
-- string.format('%d') wherever they are stored or replied (tostring's
-- %.14g differs above 10^14).

local NF = 8 -- fields per hit
local NS = 4 -- header fields per segment

local floor = math.floor
local max = math.max
local min = math.min
local tonumber = tonumber
local format = string.format
local find = string.find
local sub = string.sub
local concat = table.concat
local call = redis.call
local pcall = pcall
local unpack = unpack
local ARGV = ARGV
local KEYS = KEYS

local BIG = 9007199254740992 -- 2^53

-- FLAGS maps a hit's flags field to its number (1 release, 2 soft, 4
-- charge, 8 penalty, 16 extend).
local FLAGS = {}
for f = 0, 31 do FLAGS[format('%d', f)] = f end

-- Parse and validate every segment before anything runs. Functions below
-- are defined once per invocation, and only for the kinds it uses.
local used = {}
local anycal = false
local segs = {}
local needtime = false
local anyslow = false -- a segment not seg.fast
local skeys, nskeys = {}, 0 -- keys of string-kind hits, for the MGET
do
  local bad = function(what)
    return redis.error_reply('ERR ratelimitd take.lua: malformed arguments: ' .. what)
  end
  -- x % 1 == 0 is false for nil-free non-integers, inf and nan
  local function int(x, lo, hi) return x and x % 1 == 0 and x >= lo and x <= hi end
  -- hit_problem names the first field of a hit outside its range, or nil.
  -- cost may be up to 2^53 (algo.MaxCost: every limit denies it).
  local function hit_problem(kind, rate, period, burst, cal, mult, cost, flags)
    if not int(kind, 0, 4) then return 'kind' end
    if not int(rate, 1 - BIG, BIG - 1) then return 'rate' end
    if not int(period, 1, BIG - 1) then return 'period' end
    if not int(burst, 1 - BIG, BIG - 1) then return 'burst' end
    if not int(cal, 0, 2) then return 'calendar' end
    if not int(mult, 1, BIG - 1) then return 'multiplier' end
    if not int(cost, -BIG, BIG) then return 'cost' end
    if not FLAGS[flags] then return 'flags' end
    return nil
  end
  local nseg = tonumber(ARGV[1])
  if not int(nseg, 1, BIG - 1) then return bad('segment count') end
  local a, k = 2, 1 -- next ARGV, next KEYS
  for s = 1, nseg do
    -- The header fixes the layout (how many ARGV and KEYS follow): a bad
    -- header fails the invocation. A bad now or hit field fails only its
    -- segment (reply line "!ERR ratelimitd take.lua: invalid segment: ...").
    local mode, nowarg, nonce, nh = ARGV[a], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3])
    if (mode ~= 't' and mode ~= 'r' and mode ~= 'd') or nonce == nil or nowarg == nil or not int(nh, 0, BIG - 1) then
      return bad('header of segment ' .. s)
    end
    local problem = nil
    local snow = false
    if nowarg ~= '' then
      snow = tonumber(nowarg)
      if not int(snow, 1 - BIG, BIG - 1) then problem = 'now' end
    end
    a = a + NS
    local hits = {}
    for i = 1, nh do
      local key, kind, rate, period, burst, cal, mult, cost, flags =
        KEYS[k], tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
        tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), ARGV[a + 7]
      if key == nil then return bad('keys of segment ' .. s) end
      if not problem then
        -- hit_problem's checks inline (the common, valid case makes no call)
        if not (kind and kind % 1 == 0 and kind >= 0 and kind <= 4)
          or not (rate and rate % 1 == 0 and rate > -BIG and rate < BIG)
          or not (period and period % 1 == 0 and period > 0 and period < BIG)
          or not (burst and burst % 1 == 0 and burst > -BIG and burst < BIG)
          or not (cal and cal % 1 == 0 and cal >= 0 and cal <= 2)
          or not (mult and mult % 1 == 0 and mult >= 1 and mult < BIG)
          or not (cost and cost % 1 == 0 and cost >= -BIG and cost <= BIG)
          or not FLAGS[flags] then
          problem = (hit_problem(kind, rate, period, burst, cal, mult, cost, flags) or 'a field') .. ' of hit ' .. i
        else
          if cost < 0 then cost = 0 end
          local fl = FLAGS[flags]
          hits[i] = {
            key = key, kind = kind, rate = rate, period = period, burst = burst, cal = cal, mult = mult,
            -- charge does not apply to concurrency (algo.Hit.Kept)
            cost = cost, idx = i, release = fl % 2 == 1, soft = fl % 4 >= 2, charge = fl % 8 >= 4 and kind ~= 4,
          }
        end
      end
      a = a + NF
      k = k + 1
      if FLAGS[flags] and FLAGS[flags] % 16 >= 8 then
        -- the penalty box: 3 fields and the box's key
        local after, within, block, pkey = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), KEYS[k]
        if pkey == nil or ARGV[a + 2] == nil then return bad('keys of segment ' .. s) end
        if not problem then
          if not int(after, 1, BIG - 1) then problem = 'after of hit ' .. i
          elseif not int(within, 1, BIG - 1) then problem = 'within of hit ' .. i
          elseif not int(block, 1, BIG - 1) then problem = 'block of hit ' .. i
          else
            local h = hits[i]
            h.pkey, h.after, h.within, h.block, h.extend = pkey, after, within, block, FLAGS[flags] >= 16
            -- algo.Hit.Penalized: soft hits and releases ignore the box
            h.pen = not h.soft and not h.release
          end
        end
        a = a + 3
        k = k + 1
      end
    end
    if problem then
      -- nothing of this segment is read, written or defined for
      segs[s] = { err = 'ERR ratelimitd take.lua: invalid segment: ' .. problem }
    else
      if nowarg == '' then needtime = true end
      -- fast: a take of string kinds on distinct keys (checked below)
      local fast = mode == 't'
      for i = 1, nh do
        local h = hits[i]
        used[h.kind] = true
        if h.cal ~= 0 then anycal = true end
        if h.kind == 2 or h.kind == 4 then
          fast = false
        else
          nskeys = nskeys + 1
          skeys[nskeys] = h.key
        end
        if h.pkey then
          fast = false
          nskeys = nskeys + 1
          skeys[nskeys] = h.pkey
        end
      end
      if fast and nh > 1 then
        if nh == 2 then
          fast = hits[1].key ~= hits[2].key
        else
          local seen = {}
          for i = 1, nh do
            local key = hits[i].key
            if seen[key] then fast = false break end
            seen[key] = true
          end
        end
      end
      if not fast then anyslow = true end
      segs[s] = { mode = mode, now = snow, nonce = nonce, hits = hits, fast = fast }
    end
  end
  if a - 1 ~= #ARGV or k - 1 ~= #KEYS then return bad('length') end
end
