package agentsvc

import (
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// A LoadRecords message leaves the registry as the same records sent one
// message each do, whatever they hold: flips in
// the middle of a batch and records of the same worker after them, another
// node's worker (refused), a worker not Ready (its load kept unjudged), an
// engine of the hello not registered, an empty load (no report).
func TestBatchAppliesAsRecordsOneByOne(t *testing.T) {
	urls := []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000", "http://10.0.0.4:8000", "http://10.0.0.5:8000"}
	type side struct {
		reg *registry.Registry
		s   *Server
		st  *agentStream
	}
	now := time.Unix(1_700_000_000, 0)
	clk := func() time.Time { return now }
	open := func() side {
		reg := registry.New("e", 0)
		ev := pipeline(reg, clk)
		reg.Update(func(t *registry.Txn) error {
			t.Insert(worker("w1", urls[0], "n1"))
			t.Insert(worker("w2", urls[1], "n1"))
			w3 := worker("w3", urls[2], "n1")
			w3.Health = registry.HealthPending
			t.Insert(w3)
			t.Insert(worker("w4", urls[3], "n2")) // another node's
			return nil
		})
		st := benchStream(ev)
		st.own = []string{urls[4]} // in the hello, not registered
		return side{reg, New(reg, ev, nil, Options{Now: clk}, discard()), st}
	}
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 11))
		a, b := open(), open() // batches; one record a message
		for step := range 30 {
			now = now.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
			n := 1 + rng.IntN(10)
			if step%10 == 9 {
				n = 257 + rng.IntN(512) // a large message
			}
			recs := make([]*smgv1.LoadRecord, n)
			for i := range recs {
				recs[i] = benchRecord(urls[rng.IntN(len(urls))], rng, now)
				recs[i].Load.Ranks[0].WaitingRequests = int32(rng.IntN(8)) // the ceiling is 4
				if rng.IntN(8) == 0 {
					recs[i].Load = nil
				}
			}
			batch, _ := proto.Marshal(&smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Records{Records: &smgv1.LoadRecords{Records: recs}}})
			if err := a.s.handle(a.st, batch, now); err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				one, _ := proto.Marshal(&smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Record{Record: r}})
				if err := b.s.handle(b.st, one, now); err != nil {
					t.Fatal(err)
				}
			}
			if rng.IntN(4) == 0 {
				a.s.ev.Sweep(now)
				b.s.ev.Sweep(now)
			}
			if ra, rb := a.reg.Revision(), b.reg.Revision(); ra != rb {
				t.Fatalf("seed %d step %d: revision %d batched, %d one by one", seed, step, ra, rb)
			}
			for _, id := range []string{"w1", "w2", "w3", "w4"} {
				wa, wb := a.reg.Get(id), b.reg.Get(id)
				if wa.Overloaded != wb.Overloaded || wa.Liveness != wb.Liveness || wa.LoadRevision != wb.LoadRevision ||
					wa.AgentNode != wb.AgentNode || !proto.Equal(wa.Load, wb.Load) || !reflect.DeepEqual(wa.Evidence, wb.Evidence) {
					t.Fatalf("seed %d step %d: %s differs:\nbatched %+v\none by one %+v", seed, step, id, wa, wb)
				}
			}
			if !reflect.DeepEqual(a.st.pending, b.st.pending) {
				t.Fatalf("seed %d step %d: pending records of unregistered engines differ", seed, step)
			}
		}
		if got := a.reg.Get("w4").AgentNode; got != "" {
			t.Fatalf("another node's worker took this agent's node: %q", got)
		}
	}
}
