package registry

import (
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// startLoad is a load read at t0 from an engine started at start.
func startLoad(start float64) *smgv1.EngineLoad {
	return &smgv1.EngineLoad{Source: "vllm", Ranks: []*smgv1.RankLoad{{RunningRequests: 1}}, RunningRequests: 1,
		ProcessStartTimeSeconds: start, ReportedAt: timestamppb.New(t0)}
}

// TestARestartIsContact: a reported start time later than the known one
// bumps ContactSeq once; the same one, the first one, one within the
// slack, and bogus ones (backwards, NaN, negative, infinite, in the future)
// do not, and bogus ones are counted, never trusted.
func TestARestartIsContact(t *testing.T) {
	r := New("e", 0)
	first := float64(t0.Add(-time.Hour).Unix())
	w := put(t, r, func(w *Worker) { w.Load = startLoad(first) })
	if w.ContactSeq != 0 || w.Evidence.StartTime != first {
		t.Fatalf("first start time: contact_seq %d, held %v; want 0 and %v", w.ContactSeq, w.Evidence.StartTime, first)
	}
	for _, s := range []float64{first, first + 0.005, 0} {
		if w = put(t, r, func(w *Worker) { w.Load = startLoad(s) }); w.ContactSeq != 0 {
			t.Fatalf("start time %v against %v: contact_seq %d, want 0", s, first, w.ContactSeq)
		}
	}
	future := float64(t0.Add(2 * time.Minute).Unix())
	for i, s := range []float64{first - 60, math.NaN(), -5, math.Inf(1), future} {
		w = put(t, r, func(w *Worker) { w.Load = startLoad(s) })
		if w.ContactSeq != 0 || w.Evidence.StartTime != first || w.Evidence.StartIgnored != i+1 {
			t.Fatalf("bogus start time %v: contact_seq %d, held %v, ignored %d; want 0, %v, %d",
				s, w.ContactSeq, w.Evidence.StartTime, w.Evidence.StartIgnored, first, i+1)
		}
	}
	// The same bogus load judged again (other evidence moved) is not counted again.
	if w = put(t, r, func(w *Worker) { w.Evidence.ProbePasses++ }); w.Evidence.StartIgnored != 5 {
		t.Fatalf("ignored %d after a commit without a new load, want 5", w.Evidence.StartIgnored)
	}

	restart := float64(t0.Add(-time.Second * 2).Unix())
	w = put(t, r, func(w *Worker) { w.Load = startLoad(restart) })
	if w.ContactSeq != 1 || w.Evidence.StartTime != restart {
		t.Fatalf("restart: contact_seq %d, held %v; want 1 and %v", w.ContactSeq, w.Evidence.StartTime, restart)
	}
	for range 3 { // the restarted engine's later reports are no new contact
		if w = put(t, r, func(w *Worker) { w.Load = startLoad(restart) }); w.ContactSeq != 1 {
			t.Fatalf("same start time again: contact_seq %d, want 1", w.ContactSeq)
		}
	}
	// Back to the older start time (a liar flapping between two) is ignored.
	if w = put(t, r, func(w *Worker) { w.Load = startLoad(first) }); w.ContactSeq != 1 || w.Evidence.StartTime != restart {
		t.Fatalf("start time back to the old one: contact_seq %d, held %v", w.ContactSeq, w.Evidence.StartTime)
	}
	if w = put(t, r, func(w *Worker) { w.Load = startLoad(restart) }); w.ContactSeq != 1 {
		t.Fatalf("flapping forward again to the held one: contact_seq %d, want 1", w.ContactSeq)
	}
	// A no-report keeps the last load visible: no restart seen in it.
	if w = put(t, r, func(w *Worker) { w.Evidence.NoReport = true; w.Load = startLoad(restart + 10) }); w.ContactSeq != 1 {
		t.Fatalf("no report: contact_seq %d, want 1", w.ContactSeq)
	}
}

// TestARestartDoesNotStand: a load saying the engine restarted commits at
// once (routers hear of it), whatever its figures.
func TestARestartDoesNotStand(t *testing.T) {
	r := New("e", 0)
	first := float64(t0.Add(-time.Hour).Unix())
	w := put(t, r, func(w *Worker) { w.Load = startLoad(first) })
	same := w.Clone()
	same.Load = startLoad(first)
	if !Stands(w, same) {
		t.Fatal("the same load with the same start time does not stand")
	}
	again := w.Clone()
	again.Load = startLoad(first + 30)
	if Stands(w, again) {
		t.Fatal("a restart stands: it would wait for the next flush")
	}
}
