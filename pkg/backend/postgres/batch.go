// Batches: the concurrent decisions of the process on the same keys sent
// together, in one transaction the store commits once it has their
// decisions, and reconciled when the COMMIT's reply does not come.

package postgres

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// maxBatch is how many decisions one transaction holds at most.
const maxBatch = 64

// lockTimeoutSQL bounds the batch's wait for a row lock (lock_timeout, in
// ms) for its transaction only.
const lockTimeoutSQL = `SELECT set_config('lock_timeout', $1, true)`

// errQueued: the call's budget ran out while it waited behind the
// in-flight batch of its keys; it was never sent, so nothing was counted.
// Like a lock wait on a hot key, it says nothing of PostgreSQL's health.
var errQueued = newError(CauseTimeout, false, errors.New("no reply within the call's budget: waited behind the in-flight decisions on its keys, not sent"))

// lane queues the decisions of the process on one set of keys while a
// batch of them is in flight; its runner sends them in batches, one at a
// time.
type lane struct {
	key      string
	queue    []*pending
	inFlight int // the size of the batch in flight
}

// pending is one call waiting in a lane. sent and gone are guarded by the
// Store's lanesMu; dec and err are the runner's until done is closed.
type pending struct {
	hits []algo.Hit
	args []any
	end  time.Time
	dec  []algo.Decision
	err  error
	done chan struct{}
	sent bool // taken into a batch
	gone bool // its caller returned before it was sent
}

// decide answers hits by end. A process's concurrent decisions on the
// same keys would otherwise queue on their rows' locks in PostgreSQL,
// where a statement whose caller gave up still decides, and counts, once
// the lock is granted. Instead they queue here: one batch per set of keys
// is in flight at a time, the next holds every call that arrived
// meanwhile (up to maxBatch), one takeSQL each, in one transaction (see
// send). A call whose budget runs out while queued was never sent: it
// fails with errQueued and counts nothing.
func (s *Store) decide(ctx context.Context, hits []algo.Hit, out []algo.Decision, end time.Time) error {
	keys, args := s.args(hits)
	p := &pending{hits: hits, args: args, end: end, done: make(chan struct{})}
	lk := strings.Join(keys, "\x00")
	s.lanesMu.Lock()
	l := s.lanes[lk]
	start := l == nil
	if start {
		l = &lane{key: lk}
		s.lanes[lk] = l
	}
	l.queue = append(l.queue, p)
	s.lanesMu.Unlock()
	if start {
		s.wg.Add(1)
		go s.run(l)
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		s.lanesMu.Lock()
		sent := p.sent
		p.gone = !sent
		s.lanesMu.Unlock()
		if !sent {
			return errQueued
		}
		// Its batch is bounded by the earliest end of its calls, this
		// one's at the latest: it is answering now, and its answer
		// (counted, or an error) is this call's.
		<-p.done
	}
	if p.err != nil {
		return p.err
	}
	copy(out, p.dec)
	return nil
}

// run sends the batches of l until its queue is empty, then removes l.
func (s *Store) run(l *lane) {
	defer s.wg.Done()
	for {
		now := time.Now()
		var batch []*pending
		s.lanesMu.Lock()
		rest := l.queue[:0]
		for _, p := range l.queue {
			switch {
			case p.gone:
			case !p.end.After(now):
				// Its caller is returning errQueued: not sent.
			case len(batch) < maxBatch:
				p.sent = true
				batch = append(batch, p)
			default:
				rest = append(rest, p)
			}
		}
		clear(l.queue[len(rest):])
		l.queue = rest
		l.inFlight = len(batch)
		if len(batch) == 0 && len(l.queue) == 0 {
			delete(s.lanes, l.key)
			s.lanesMu.Unlock()
			return
		}
		s.lanesMu.Unlock()
		if len(batch) > 0 {
			s.send(batch)
		}
	}
}

// send runs batch in one transaction and sets each call's decisions or
// error, then releases its callers. The transaction is committed by the
// store once it has every decision, in a second round trip: until then a
// caller that gives up (a closed connection) leaves nothing counted. A
// COMMIT whose reply is lost or late leaves the outcome unknown to the
// callers, who fail with a timeout; reconcile then asks PostgreSQL for the
// transaction's status and refunds its takes if it committed.
func (s *Store) send(batch []*pending) {
	defer func() {
		for _, p := range batch {
			close(p.done)
		}
	}()
	fail := func(err error) {
		for _, p := range batch {
			p.err = err
		}
	}
	end := batch[0].end
	for _, p := range batch[1:] {
		if p.end.Before(end) {
			end = p.end
		}
	}
	rem := time.Until(end)
	if rem < time.Millisecond {
		fail(errQueued)
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	// timedOut is err, or errTimeout once the batch's budget ran out
	// (whose timer may fire before its callers' own).
	timedOut := func(err error) error {
		if ctx.Err() != nil {
			return errTimeout
		}
		return classify(err, s.secrets)
	}
	argss := make([][]any, len(batch))
	for i, p := range batch {
		argss[i] = p.args
	}
	decs := make([][]algo.Decision, len(batch))
	var rows []takeRow
	xid, sent, err := s.txTake(ctx, argss, rem, func(r []takeRow) error {
		rows = r
		for i, p := range batch {
			decs[i] = make([]algo.Decision, len(p.hits))
			if err := decode(p.hits, &r[i], decs[i]); err != nil {
				return err
			}
		}
		if s.beforeCommit != nil {
			s.beforeCommit()
		}
		return nil
	})
	if err != nil {
		if sent {
			// The COMMIT may have been applied: find out, and refund.
			if refund := refunds(batch, rows); len(refund) > 0 {
				s.wg.Add(1)
				s.reconciling.Add(1)
				go s.reconcile(xid, refund)
			}
		}
		var e *Error
		if errors.As(err, &e) && e.Cause() == CauseOther {
			fail(err) // a defect found by decode
			return
		}
		fail(timedOut(err))
		return
	}
	for i, p := range batch {
		p.dec = decs[i]
	}
}

// txTake runs one takeSQL call per element of argss in one transaction:
// BEGIN, lock_timeout for it, the calls and the transaction's id in one
// round trip; then check on the rows, and COMMIT only if it returns nil.
// Nothing is counted unless the COMMIT is sent: on an error before it,
// the connection is closed (the pool closes a connection released in a
// transaction) and PostgreSQL rolls back. sent reports an error of the
// COMMIT that leaves its outcome unknown (no reply), xid the transaction
// to ask about.
func (s *Store) txTake(ctx context.Context, argss [][]any, lockWait time.Duration, check func([]takeRow) error) (xid string, sent bool, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return "", false, err
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(lockTimeoutSQL, strconv.FormatInt(max(lockWait.Milliseconds(), 1), 10))
	for _, a := range argss {
		b.Queue(takeSQL, a...)
	}
	b.Queue(xidSQL)
	rows := make([]takeRow, len(argss))
	br := conn.SendBatch(ctx, b)
	_, err = br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	for i := range rows {
		if err != nil {
			break
		}
		r := &rows[i]
		err = br.QueryRow().Scan(&r.nowUs, &r.mode, &r.stWin, &r.stCnt, &r.stPrv, &r.allowed)
	}
	if err == nil {
		err = br.QueryRow().Scan(&xid)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", false, err
	}
	if err := check(rows); err != nil {
		return "", false, err
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		var pe *pgconn.PgError
		return xid, !errors.As(err, &pe), err
	}
	return xid, false, nil
}

// xidSQL returns the batch's transaction id, whose status reconcile asks
// for when the COMMIT's reply does not come.
const xidSQL = `SELECT pg_current_xact_id()::text`

// refunds are the releases that undo the takes of batch that counted
// (rows: its decisions): every hit applied (mode 0) that was allowed or
// charged, not a release itself.
func refunds(batch []*pending, rows []takeRow) []algo.Hit {
	var out []algo.Hit
	for i, p := range batch {
		for j, h := range p.hits {
			if h.Release || rows[i].mode[j] != 0 || algo.ClampCost(h.Cost) <= 0 || (!rows[i].allowed[j] && !h.Charge) {
				continue
			}
			out = append(out, algo.Hit{Key: h.Key, Limit: h.Limit, Cost: h.Cost, Release: true})
		}
	}
	return out
}

// reconcile asks PostgreSQL, every unhealthyProbeInterval doubling up to
// reconcileMaxWait, whether transaction xid committed; if it did, it
// releases refund (the takes of callers told the decision failed) in a
// transaction of its own, reconciled the same way: a refund whose COMMIT's
// reply does not come is sent again only once PostgreSQL says it rolled
// back (twice refunded would over-admit). It gives up, and logs the
// units left spent, when the Store closes first or PostgreSQL no longer
// knows a transaction's status.
func (s *Store) reconcile(xid string, refund []algo.Hit) {
	defer s.wg.Done()
	defer s.reconciling.Add(-1)
	_, args := s.args(refund)
	argss := [][]any{args}
	noCheck := func([]takeRow) error { return nil }
	refunding := false // xid is the refund's transaction
	wait := unhealthyProbeInterval
	for {
		t := time.NewTimer(wait)
		select {
		case <-s.stop:
			t.Stop()
			s.log.Warn("durable store: decisions answered as failed may have been counted and were not refunded: the store closed first", "hits", len(refund))
			return
		case <-t.C:
		}
		wait = min(2*wait, reconcileMaxWait)
		if xid != "" {
			ctx, cancel := context.WithTimeout(context.Background(), s.opts.ConnectTimeout)
			var status *string
			err := s.pool.QueryRow(ctx, "SELECT pg_xact_status($1::xid8)", xid).Scan(&status)
			cancel()
			switch {
			case err != nil || (status != nil && *status == "in progress"):
				continue
			case status == nil:
				s.log.Warn("durable store: decisions answered as failed may have been counted and were not refunded: PostgreSQL no longer knows the transaction's status", "hits", len(refund))
				return
			case *status == "committed" && refunding:
				s.refunded.Add(uint64(len(refund)))
				s.log.Info("durable store: refunded the takes of a transaction that committed after its callers were answered with a timeout", "hits", len(refund))
				return
			case *status != "committed" && !refunding:
				return // rolled back: nothing counted
			}
			// The decisions committed, or the refund rolled back: refund.
			xid, refunding = "", true
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.ConnectTimeout)
		id, sent, err := s.txTake(ctx, argss, s.opts.ConnectTimeout, noCheck)
		cancel()
		switch {
		case err == nil:
			s.refunded.Add(uint64(len(refund)))
			s.log.Info("durable store: refunded the takes of a transaction that committed after its callers were answered with a timeout", "hits", len(refund))
			return
		case sent:
			xid = id // ask whether the refund committed
		}
	}
}

// reconcileMaxWait is the longest wait between reconcile's questions.
const reconcileMaxWait = 5 * time.Second
