package monitor

import (
	"context"
	"time"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/internal/backoff"
	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/loadpb"
)

// kvStream is one gRPC worker's KV event stream, run by the monitor for a
// Ready worker no agent covers.
type kvStream struct {
	url    string
	cancel context.CancelFunc
	ranks  enginegrpc.Ranks
}

// reconcileStreams starts a stream for each Ready gRPC worker no agent
// covers and stops the others'.
func (m *Monitor) reconcileStreams(ctx context.Context, workers []*registry.Worker) {
	if m.opts.GRPC == nil || m.opts.Covered == nil {
		return
	}
	want := map[string]*registry.Worker{}
	for _, w := range workers {
		if w.Ready() && enginegrpc.IsGRPC(w.Spec.GetUrl()) && !m.opts.Covered(w.Spec.GetUrl()) {
			want[w.ID] = w
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, st := range m.streams {
		if w := want[id]; w == nil || w.Spec.GetUrl() != st.url {
			st.cancel()
			delete(m.streams, id)
		}
	}
	for id, w := range want {
		if m.streams[id] != nil {
			continue
		}
		c, err := m.opts.GRPC.Get(w.Spec.GetUrl())
		if err != nil {
			continue
		}
		sctx, cancel := context.WithCancel(ctx)
		st := &kvStream{url: w.Spec.GetUrl(), cancel: cancel}
		m.streams[id] = st
		m.polls.Go(func() { m.runStream(sctx, id, c, st) })
	}
}

// KVStreams is the number of KV event streams the monitor keeps (one per
// Ready gRPC worker no agent covers).
func (m *Monitor) KVStreams() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.streams)
}

// pushed reports whether pushed records make this tick's poll of the
// worker unnecessary: its KV stream here delivered a record for every
// pushing rank within d or, without one, an agent delivered within d.
func (m *Monitor) pushed(workerID string, d time.Duration, now time.Time) bool {
	m.mu.Lock()
	st := m.streams[workerID]
	m.mu.Unlock()
	if st != nil {
		return st.ranks.Covers(d, now)
	}
	return m.opts.RecentlyPushed != nil && m.opts.RecentlyPushed(workerID, d, now)
}

// runStream keeps the worker's stream open, reconnecting with backoff. A
// connection failure on it is a transport failure of the worker's channels.
func (m *Monitor) runStream(ctx context.Context, id string, c *enginegrpc.Client, st *kvStream) {
	bo := backoff.New(backoff.Policy{Max: 5 * time.Second}, nil)
	for ctx.Err() == nil {
		err := m.readStream(ctx, id, c, st, bo)
		if ctx.Err() != nil {
			return
		}
		st.ranks.Reset() // the poll takes over until records come again
		if enginegrpc.IsConnectionFailure(err) {
			m.ingest.PollTransportFailure(id, err, m.opts.Now())
			m.log.Debug("KV event stream failed", "worker_id", id, "error", err)
		} else if err != nil {
			m.log.Debug("KV event stream ended", "worker_id", id, "error", err)
		}
		if !backoff.Sleep(ctx, bo.Next()) {
			return
		}
	}
}

func (m *Monitor) readStream(ctx context.Context, id string, c *enginegrpc.Client, st *kvStream, bo *backoff.Backoff) error {
	s, err := c.SubscribeKV(ctx, 0)
	if err != nil {
		return err
	}
	for {
		b, err := s.Recv()
		if err != nil {
			return c.Wrap(err)
		}
		bo.Reset()
		p, ok, err := enginegrpc.ReadPushed(b)
		if !ok {
			continue // a servicer without load records: the poll feeds the worker
		}
		if err != nil {
			m.log.Warn("KV event batch with a load record that cannot be believed; dropped", "worker_id", id, "url", st.url, "error", err)
			continue
		}
		now := m.opts.Now()
		merged, err := st.ranks.Add(p, now)
		if err != nil {
			continue
		}
		flavor, _ := c.Flavor(ctx)
		rep, err := enginegrpc.ToReport(flavor, merged.Loads)
		if err != nil {
			continue
		}
		rec := judge.Record{Waiting: rep.Waiting(), Idle: rep.Running() == 0, PrefillInHand: merged.Prefill, StepWire: merged.StepWire, Pushed: true}
		if merged.Silence != nil {
			rec.Silence = *merged.Silence
		}
		m.ingest.Record(id, rec, now) // holds the worker to the push cadence, with the engine-silence figure
		m.ingested(id, m.ingest.Report(id, loadpb.FromReport(rep, now)))
	}
}
