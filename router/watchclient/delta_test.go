package watchclient

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/router"
)

// fullOnly hides the router's ApplyDelta: the client then publishes every
// message as a whole snapshot, as it did before deltas were patched.
type fullOnly struct{ r *router.Router }

func (f fullOnly) Apply(s *router.Snapshot)          { f.r.Apply(s) }
func (f fullOnly) FailOpen()                         { f.r.FailOpen() }
func (f fullOnly) ContactSeen(id string)             { f.r.ContactSeen(id) }
func (f fullOnly) Observations() router.Observations { return f.r.Observations() }

func newRouter(t *testing.T) *router.Router {
	t.Helper()
	opts := router.DefaultOptions()
	opts.WorkerAdmissionWindow = true
	r, err := router.New(opts, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// loads is the router's GET /loads body: every worker as it holds it.
func loads(t *testing.T, r *router.Router) string {
	t.Helper()
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/loads", nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return string(body)
}

func randomWorker(rng *rand.Rand, id int) *smgv1.RoutingWorker {
	w := &smgv1.RoutingWorker{
		WorkerId: fmt.Sprintf("w%03d", id), Url: fmt.Sprintf("http://10.0.0.%d:8000", rng.IntN(200)),
		Model: []string{"a", "b"}[rng.IntN(2)], WorkerType: []string{"regular", "regular", "decode", "prefill"}[rng.IntN(4)],
		Healthy: rng.IntN(5) > 0, Veto: smgv1.Veto(rng.IntN(4)), WaitingRequests: rng.Int64N(9),
		RunningRequests: rng.Int64N(9), LoadRevision: rng.Uint64N(50), MaxRunningRequests: rng.Int64N(3) * 8,
		AdmissionRooms: rng.Int64N(3) * 10, WindowShare: rng.Int64N(4) - 1, ContactSeq: rng.Uint64N(3),
	}
	return w
}

// The router a client feeds deltas to (patched in place) holds, after every
// message, exactly what a router fed whole snapshots holds: the same
// workers with the same verdicts, loads and windows, through snapshots and
// deltas of every kind, epoch changes with warm-up (kept workers), windows
// carried over a failover, and fail-open.
func TestDeltasMatchWholeSnapshots(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 16))
			rd, rf := newRouter(t), newRouter(t)
			now := time.Unix(1000, 0)
			clock := func() time.Time { return now }
			cd := New(nil, rd, Options{RouterID: "d", Now: clock}, nil)
			cf := New(nil, fullOnly{rf}, Options{RouterID: "f", Now: clock}, nil)
			t.Cleanup(cd.stopStale)
			t.Cleanup(cf.stopStale)
			epoch, rev := 0, uint64(0)
			snapshot := func() *smgv1.WatchResponse {
				rev++
				var ws []*smgv1.RoutingWorker
				for i := range 100 {
					if rng.IntN(3) > 0 {
						ws = append(ws, randomWorker(rng, i))
					}
				}
				return &smgv1.WatchResponse{Epoch: fmt.Sprint("e", epoch), Revision: rev, Msg: &smgv1.WatchResponse_Snapshot{
					Snapshot: &smgv1.WatchSnapshot{Workers: ws, WarmingSecs: int32(rng.IntN(2) * 3600),
						Settings: &smgv1.FleetSettings{LoadMonitorIntervalSecs: 1 + int32(rng.IntN(4)/3), WorkerStaleSecs: 3600}}}}
			}
			for step := range 120 {
				var msg *smgv1.WatchResponse
				switch op := rng.IntN(25); {
				case step == 0 || op == 0:
					msg = snapshot()
				case op == 1:
					epoch++ // a failover: a new leader, maybe warming up
					rev = 0
					msg = snapshot()
				case op == 2: // silent past the stale bound
					now = now.Add(time.Hour + time.Second)
					for _, c := range []*Client{cd, cf} {
						c.staleFired()
					}
				case op == 3:
					msg = &smgv1.WatchResponse{Epoch: fmt.Sprint("e", epoch), Revision: rev,
						Msg: &smgv1.WatchResponse_Heartbeat{Heartbeat: &smgv1.WatchHeartbeat{}}}
				case op == 4: // the stale bound passed on the windows carried
					now = now.Add(time.Hour + time.Second)
					fallthrough // into a delta
				default:
					rev++
					d := &smgv1.WatchDelta{}
					for range 1 + rng.IntN(6) {
						d.Upserts = append(d.Upserts, randomWorker(rng, rng.IntN(110)))
					}
					for range rng.IntN(2) {
						d.Removed = append(d.Removed, fmt.Sprintf("w%03d", rng.IntN(110)))
					}
					msg = &smgv1.WatchResponse{Epoch: fmt.Sprint("e", epoch), Revision: rev, Msg: &smgv1.WatchResponse_Delta{Delta: d}}
				}
				if msg != nil {
					errD, errF := cd.handle(msg), cf.handle(msg)
					if (errD == nil) != (errF == nil) {
						t.Fatalf("step %d: errors differ: %v / %v", step, errD, errF)
					}
				}
				if a, b := loads(t, rd), loads(t, rf); a != b {
					t.Fatalf("step %d: the router fed deltas holds\n%s\nthe router fed snapshots\n%s", step, a, b)
				}
			}
		})
	}
}
