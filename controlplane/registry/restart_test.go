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

// TestRestartsBelievedOncePerGap: an engine that claims a new start time at
// every report forces one contact per restartGap of its loads' time, not one
// per report; a claim within the gap is still trusted, so it is no restart
// later either, and it commits with the next flush like any load.
func TestRestartsBelievedOncePerGap(t *testing.T) {
	r := New("e", 0)
	at := func(start float64, reported time.Duration) func(*Worker) {
		return func(w *Worker) {
			w.Load = startLoad(start)
			w.Load.ReportedAt = timestamppb.New(t0.Add(reported))
		}
	}
	first := float64(t0.Add(-time.Hour).Unix())
	put(t, r, at(first, 0))
	w := put(t, r, at(first+100, time.Second))
	if w.ContactSeq != 1 {
		t.Fatalf("first restart: contact_seq %d, want 1", w.ContactSeq)
	}
	for i := 2; i < 10; i++ { // a new start claimed every second
		next := w.Clone()
		next.Load = startLoad(first + 100 + float64(i))
		next.Load.ReportedAt = timestamppb.New(t0.Add(time.Duration(i) * time.Second))
		if !Stands(w, next) {
			t.Fatalf("a restart claimed %d s after the last believed one does not stand", i-1)
		}
		if w = put(t, r, at(first+100+float64(i), time.Duration(i)*time.Second)); w.ContactSeq != 1 || w.Evidence.StartTime != first+100+float64(i) {
			t.Fatalf("restart claimed %d s after the last: contact_seq %d, held %v; want 1 and %v",
				i-1, w.ContactSeq, w.Evidence.StartTime, first+100+float64(i))
		}
	}
	if w = put(t, r, at(first+111, 11*time.Second)); w.ContactSeq != 2 {
		t.Fatalf("a restart 10 s after the last believed one: contact_seq %d, want 2", w.ContactSeq)
	}
	if w.Evidence.StartIgnored != 8 {
		t.Fatalf("ignored %d, want the 8 claims within the gap", w.Evidence.StartIgnored)
	}
}
