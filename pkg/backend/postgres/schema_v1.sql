-- Schema version 1 of the durable store. Every function ports the pkg/algo
-- function named in its comment for fixed windows and sliding window
-- counters, in integer microseconds (the float8 estimate of the sliding
-- window counter rounds exactly as Go's float64 does). Every statement is
-- idempotent (IF NOT EXISTS, OR REPLACE): the store runs the script again
-- to recreate an object found missing (see repairSchema).

-- ratelimitd_counters holds one row per key: algo.State's Time (win),
-- Count and Prev, and expires_us, from which the row equals a key never
-- used (algo.ExpiresAtUs; 0: already empty), for the sweeper.
CREATE TABLE IF NOT EXISTS ratelimitd_counters (
	key        text COLLATE "C" PRIMARY KEY,
	win        bigint NOT NULL,
	count      bigint NOT NULL,
	prev       bigint NOT NULL,
	expires_us bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS ratelimitd_counters_expires ON ratelimitd_counters (expires_us);

-- floorDiv: floor(a/b) for b > 0.
CREATE OR REPLACE FUNCTION ratelimitd_floor_div(a bigint, b bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
	SELECT CASE WHEN a % b <> 0 AND a < 0 THEN a / b - 1 ELSE a / b END
$$;

-- daysFromCivil.
CREATE OR REPLACE FUNCTION ratelimitd_days_from_civil(y bigint, m bigint, d bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
	era bigint; yoe bigint; mp bigint; doy bigint; doe bigint;
BEGIN
	IF m <= 2 THEN y := y - 1; END IF;
	era := ratelimitd_floor_div(y, 400);
	yoe := y - era * 400;
	mp := (m + 9) % 12;
	doy := (153 * mp + 2) / 5 + d - 1;
	doe := yoe * 365 + yoe / 4 - yoe / 100 + doy;
	RETURN era * 146097 + doe - 719468;
END
$$;

-- civilFromDays: year and month of day z.
CREATE OR REPLACE FUNCTION ratelimitd_civil_from_days(z bigint, OUT y bigint, OUT m bigint)
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
	era bigint; doe bigint; yoe bigint; doy bigint; mp bigint;
BEGIN
	z := z + 719468;
	era := ratelimitd_floor_div(z, 146097);
	doe := z - era * 146097;
	yoe := (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	y := yoe + era * 400;
	doy := doe - (365 * yoe + yoe / 4 - yoe / 100);
	mp := (5 * doy + 2) / 153;
	IF mp < 10 THEN m := mp + 3; ELSE m := mp - 9; END IF;
	IF m <= 2 THEN y := y + 1; END IF;
END
$$;

-- monthStartUs: the instant month index mi (months from January 1970) begins.
CREATE OR REPLACE FUNCTION ratelimitd_month_start(mi bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
	SELECT ratelimitd_days_from_civil(1970 + ratelimitd_floor_div(mi, 12),
		mi - ratelimitd_floor_div(mi, 12) * 12 + 1, 1) * 86400000000
$$;

-- WindowBoundsUs: the window [ws, we) holding t. cal: 0 epoch-aligned
-- windows of period µs, 1 calendar months, 2 calendar years (algo.Calendar).
CREATE OR REPLACE FUNCTION ratelimitd_window(t bigint, period bigint, cal int, mult bigint, OUT ws bigint, OUT we bigint)
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
	mu bigint := greatest(mult, 1); y bigint; mo bigint; k bigint;
BEGIN
	IF cal = 1 OR cal = 2 THEN
		SELECT c.y, c.m INTO y, mo FROM ratelimitd_civil_from_days(ratelimitd_floor_div(t, 86400000000)) c;
		IF cal = 1 THEN
			k := ratelimitd_floor_div((y - 1970) * 12 + (mo - 1), mu) * mu;
			ws := ratelimitd_month_start(k);
			we := ratelimitd_month_start(k + mu);
		ELSE
			k := ratelimitd_floor_div(y - 1970, mu) * mu;
			ws := ratelimitd_month_start(k * 12);
			we := ratelimitd_month_start((k + mu) * 12);
		END IF;
	ELSE
		ws := ratelimitd_floor_div(t, period) * period;
		we := ws + period;
	END IF;
END
$$;

-- ExpiresAtUs for the two kinds (0: fixed window, 1: sliding window).
CREATE OR REPLACE FUNCTION ratelimitd_expires(kind int, period bigint, cal int, mult bigint, win bigint, cnt bigint, prv bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
	e bigint;
BEGIN
	IF kind = 0 THEN
		IF cnt = 0 THEN RETURN 0; END IF;
		RETURN (ratelimitd_window(win, period, cal, mult)).we;
	END IF;
	e := (ratelimitd_window(win, period, cal, mult)).we;
	IF cnt > 0 THEN RETURN (ratelimitd_window(e, period, cal, mult)).we; END IF;
	IF prv > 0 THEN RETURN e; END IF;
	RETURN 0;
END
$$;

-- ratelimitd_apply is algo.Apply on one state (win, cnt, prv) at t for
-- fixed windows (kind 0) and sliding window counters (kind 1): flags bit 1
-- release, bit 2 charge (always_charge). It returns whether the hit is
-- allowed and the state after it.
CREATE OR REPLACE FUNCTION ratelimitd_apply(t bigint, kind int, rate bigint, period bigint, cal int, mult bigint,
	cost bigint, flags int, win bigint, cnt bigint, prv bigint,
	OUT allowed boolean, OUT n_win bigint, OUT n_cnt bigint, OUT n_prv bigint)
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
	ws bigint; we bigint; ps bigint; tw bigint;
	curr bigint := 0; prev bigint := 0; rem bigint; c bigint; p bigint;
	w float8;
	charge boolean := (flags & 2) <> 0 AND cost > 0;
BEGIN
	allowed := false; n_win := win; n_cnt := cnt; n_prv := prv;
	SELECT b.ws, b.we INTO ws, we FROM ratelimitd_window(t, period, cal, mult) b;
	IF (flags & 1) <> 0 THEN
		-- refund: creditFixed, creditSliding
		allowed := true;
		IF cost <= 0 OR rate <= 0 THEN RETURN; END IF;
		IF kind = 0 THEN
			IF win < ws OR cnt <= 0 THEN RETURN; END IF;
			c := greatest(cnt - cost, 0);
			IF c = 0 THEN n_win := 0; n_cnt := 0; n_prv := 0; ELSE n_cnt := c; n_prv := 0; END IF;
			RETURN;
		END IF;
		IF win >= ws THEN
			ws := win; curr := cnt; prev := prv;
		ELSIF (ratelimitd_window(ws - 1, period, cal, mult)).ws = win THEN
			prev := cnt;
		END IF;
		IF curr <= 0 AND prev <= 0 THEN RETURN; END IF;
		c := greatest(curr - cost, 0);
		p := greatest(prev - (cost - (curr - c)), 0);
		IF c = 0 AND p = 0 THEN
			n_win := 0; n_cnt := 0; n_prv := 0;
		ELSE
			n_win := ws; n_cnt := c; n_prv := p;
		END IF;
		RETURN;
	END IF;
	IF rate <= 0 THEN RETURN; END IF;
	IF kind = 0 THEN
		-- fixedWindow
		IF win = ws THEN
			curr := cnt;
		ELSIF win > ws THEN -- the clock went back into an earlier window: keep the later one
			ws := win; curr := cnt;
		END IF;
		rem := greatest(rate - curr, 0);
		IF greatest(cost, 1) > rem THEN
			IF charge THEN
				n_win := ws; n_cnt := least(curr + cost, 9007199254740992); n_prv := 0;
			END IF;
			RETURN;
		END IF;
		allowed := true;
		IF cost > 0 THEN
			n_win := ws; n_cnt := curr + cost; n_prv := 0;
		END IF;
		RETURN;
	END IF;
	-- slidingWindow
	IF win = ws THEN
		curr := cnt; prev := prv;
	ELSIF win > ws THEN -- the clock went back into an earlier window: keep the later one
		ws := win; we := (ratelimitd_window(ws, period, cal, mult)).we;
		curr := cnt; prev := prv;
	ELSE
		ps := (ratelimitd_window(ws - 1, period, cal, mult)).ws;
		IF win = ps THEN prev := cnt; END IF;
	END IF;
	tw := greatest(t, ws);
	w := (we - tw)::float8 / (we - ws)::float8;
	rem := greatest(floor(rate::float8 - ((prev::float8 * w) + curr::float8))::bigint, 0);
	IF greatest(cost, 1) > rem THEN
		IF charge THEN
			n_win := ws; n_cnt := least(curr + cost, 9007199254740992); n_prv := prev;
		END IF;
		RETURN;
	END IF;
	allowed := true;
	IF cost > 0 THEN
		n_win := ws; n_cnt := curr + cost; n_prv := prev;
	END IF;
END
$$;

-- ratelimitd_take decides one request (the service.Store contract, as
-- algotest.Reference runs it) in one call: keys are the request's distinct
-- keys in the order they are locked (sorted by the caller, so that two
-- requests never wait on each other's locks in a cycle); hit i is on
-- keys[slot[i]] with its limit (kind, rate, period µs, cal, mult), cost and
-- flags (1 release, 2 charge, 4 soft). p_now is the instant in µs, or NULL
-- for the server's clock, read once every key is locked. It returns the
-- instant, and per hit the state its decision is computed from (st_*),
-- whether it is applied to it (mode 0) or checked on it (mode 1: a hit
-- that did not deny in a denied request) and whether it was allowed.
CREATE OR REPLACE FUNCTION ratelimitd_take(p_now bigint, p_keys text[], p_slot int[], p_kind int[], p_rate bigint[],
	p_period bigint[], p_cal int[], p_mult bigint[], p_cost bigint[], p_flags int[],
	OUT now_us bigint, OUT mode int[], OUT st_win bigint[], OUT st_cnt bigint[], OUT st_prv bigint[], OUT allowed boolean[])
LANGUAGE plpgsql AS $$
DECLARE
	n int := coalesce(array_length(p_slot, 1), 0);
	nk int := coalesce(array_length(p_keys, 1), 0);
	o_win bigint[]; o_cnt bigint[]; o_prv bigint[];
	c_win bigint[]; c_cnt bigint[]; c_prv bigint[];
	last int[];
	denied boolean := false;
	i int; s int;
	r record; d record;
BEGIN
	FOR s IN 1..nk LOOP
		LOOP
			SELECT win, count, prev INTO r FROM ratelimitd_counters WHERE key = p_keys[s] FOR UPDATE;
			EXIT WHEN FOUND;
			INSERT INTO ratelimitd_counters (key, win, count, prev, expires_us)
				VALUES (p_keys[s], 0, 0, 0, 0) ON CONFLICT DO NOTHING;
		END LOOP;
		o_win[s] := r.win; o_cnt[s] := r.count; o_prv[s] := r.prev; last[s] := 0;
	END LOOP;
	now_us := coalesce(p_now, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
	c_win := o_win; c_cnt := o_cnt; c_prv := o_prv;
	mode := array_fill(0, ARRAY[n]); allowed := array_fill(false, ARRAY[n]);
	st_win := array_fill(0::bigint, ARRAY[n]); st_cnt := st_win; st_prv := st_win;
	FOR i IN 1..n LOOP
		s := p_slot[i];
		st_win[i] := c_win[s]; st_cnt[i] := c_cnt[s]; st_prv[i] := c_prv[s];
		SELECT * INTO d FROM ratelimitd_apply(now_us, p_kind[i], p_rate[i], p_period[i], p_cal[i], p_mult[i], p_cost[i], p_flags[i], c_win[s], c_cnt[s], c_prv[s]);
		allowed[i] := d.allowed;
		c_win[s] := d.n_win; c_cnt[s] := d.n_cnt; c_prv[s] := d.n_prv; last[s] := i;
		IF NOT d.allowed AND (p_flags[i] & 4) = 0 THEN denied := true; END IF;
	END LOOP;
	IF denied THEN
		-- Replay on the states before the request: Kept hits (releases,
		-- always_charge) apply, the others that did not deny check.
		c_win := o_win; c_cnt := o_cnt; c_prv := o_prv;
		FOR s IN 1..nk LOOP last[s] := 0; END LOOP;
		FOR i IN 1..n LOOP
			s := p_slot[i];
			IF (p_flags[i] & 3) <> 0 THEN
				st_win[i] := c_win[s]; st_cnt[i] := c_cnt[s]; st_prv[i] := c_prv[s];
				SELECT * INTO d FROM ratelimitd_apply(now_us, p_kind[i], p_rate[i], p_period[i], p_cal[i], p_mult[i], p_cost[i], p_flags[i], c_win[s], c_cnt[s], c_prv[s]);
				allowed[i] := d.allowed;
				c_win[s] := d.n_win; c_cnt[s] := d.n_cnt; c_prv[s] := d.n_prv; last[s] := i;
			ELSIF allowed[i] THEN
				st_win[i] := c_win[s]; st_cnt[i] := c_cnt[s]; st_prv[i] := c_prv[s];
				mode[i] := 1;
			END IF;
		END LOOP;
	END IF;
	FOR s IN 1..nk LOOP
		i := last[s];
		IF i > 0 AND (c_win[s], c_cnt[s], c_prv[s]) IS DISTINCT FROM (o_win[s], o_cnt[s], o_prv[s]) THEN
			UPDATE ratelimitd_counters SET win = c_win[s], count = c_cnt[s], prev = c_prv[s],
				expires_us = ratelimitd_expires(p_kind[i], p_period[i], p_cal[i], p_mult[i], c_win[s], c_cnt[s], c_prv[s])
				WHERE key = p_keys[s];
		END IF;
	END LOOP;
END
$$;
