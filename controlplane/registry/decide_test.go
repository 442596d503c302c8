package registry

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/smg-project/smg/controlplane/judge"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func readyWorker() *Worker {
	return &Worker{ID: "a", Spec: &smgv1.WorkerSpec{Url: "http://a"}, Health: HealthHealthy,
		Thresholds: judge.Thresholds{WaitingRequests: 8}}
}

func put(t *testing.T, r *Registry, fn func(w *Worker)) *Worker {
	t.Helper()
	if _, err := r.Update(func(tx *Txn) error {
		w := tx.Get("a")
		if w == nil {
			w = readyWorker()
		} else {
			w = w.Clone()
		}
		fn(w)
		tx.Insert(w)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return r.Get("a")
}

func TestInsertDecidesTheOverloadVerdictFromTheStoredLoad(t *testing.T) {
	r := New("e", 0)
	w := put(t, r, func(w *Worker) { w.Load = &smgv1.EngineLoad{WaitingRequests: 9} })
	if !w.Overloaded || w.OverloadReason != "waiting_requests 9 >= 8" {
		t.Fatalf("overloaded %v %q, want vetoed by waiting 9 >= 8", w.Overloaded, w.OverloadReason)
	}
	w = put(t, r, func(w *Worker) { w.Overloaded, w.OverloadReason = false, "" }) // a writer cannot clear it
	if !w.Overloaded {
		t.Fatal("a writer cleared the verdict its evidence supports")
	}
	w = put(t, r, func(w *Worker) { w.Evidence.NoReport = true })
	if w.Overloaded || w.OverloadReason != "" {
		t.Fatal("no report: the veto must clear (fail open)")
	}
	w = put(t, r, func(w *Worker) { w.Evidence.NoReport = false; w.Health = HealthUnhealthy })
	if w.Overloaded {
		t.Fatal("a worker not Ready got an overload veto")
	}
	w = put(t, r, func(w *Worker) { w.Health = HealthHealthy })
	if !w.Overloaded {
		t.Fatal("back in Ready, the stored load must veto again")
	}
}

func TestInsertDecidesTheLivenessVetoAndDropsEvidenceOutsideReady(t *testing.T) {
	r := New("e", 0)
	rules := judge.LivenessConfig{StallSecs: 0, WedgeSecs: 3}.Rules()
	w := put(t, r, func(w *Worker) { w.Evidence.Live.Failure(t0, judge.ConnectionFailure, &rules) })
	if w.Liveness != smgv1.Veto_VETO_UNREACHABLE || w.LivenessReason == "" {
		t.Fatalf("liveness %v %q, want unreachable with its cause", w.Liveness, w.LivenessReason)
	}
	seq := w.ContactSeq
	w = put(t, r, func(w *Worker) { w.Evidence.Live.Contact(t0.Add(time.Second), &rules) })
	if w.Liveness != smgv1.Veto_VETO_UNSPECIFIED || w.ContactSeq != seq+1 {
		t.Fatalf("after contact: %v contact_seq %d, want no veto and contact_seq %d", w.Liveness, w.ContactSeq, seq+1)
	}
	w = put(t, r, func(w *Worker) { w.Evidence.Live.Failure(t0.Add(2*time.Second), judge.ConnectionFailure, &rules) })
	seq = w.ContactSeq
	w = put(t, r, func(w *Worker) {
		w.Health = HealthUnhealthy
		w.Evidence.Routers = map[string]RouterView{"r1": {Streams: 3}}
		w.Evidence.PushedAt = t0
	})
	if w.Liveness != smgv1.Veto_VETO_UNSPECIFIED || w.Evidence.Live != (judge.Liveness{}) || w.Evidence.Routers != nil || !w.Evidence.PushedAt.IsZero() {
		t.Fatalf("leaving Ready must drop the liveness evidence and veto: %v %+v", w.Liveness, w.Evidence)
	}
	if w.ContactSeq != seq+1 {
		t.Fatal("leaving unreachable by leaving Ready must bump contact_seq (routers close the breaker)")
	}
}

func TestANewURLStartsTheEvidenceAfresh(t *testing.T) {
	r := New("e", 0)
	put(t, r, func(w *Worker) { w.Evidence.ProbePasses, w.Evidence.NoReport = 2, true })
	w := put(t, r, func(w *Worker) { w.Spec = &smgv1.WorkerSpec{Url: "http://b"} })
	if w.Evidence.ProbePasses != 0 || w.Evidence.NoReport {
		t.Fatalf("evidence of the old engine kept: %+v", w.Evidence)
	}
}

func TestEvidenceAloneCommitsNoRevision(t *testing.T) {
	r := New("e", 0)
	put(t, r, func(*Worker) {})
	rev := r.Revision()
	ch := r.Changed()
	w := put(t, r, func(w *Worker) { w.Evidence.ProbePasses = 1 })
	if r.Revision() != rev || w.Revision != rev {
		t.Fatalf("an evidence-only change made revision %d (record %d), want %d", r.Revision(), w.Revision, rev)
	}
	if w.Evidence.ProbePasses != 1 {
		t.Fatal("the evidence was not stored")
	}
	select {
	case <-ch:
		t.Fatal("an evidence-only change woke the watchers")
	default:
	}
	put(t, r, func(w *Worker) { w.AgentNode = "n1" })
	if r.Revision() != rev+1 {
		t.Fatal("a visible change must commit a revision")
	}
}

// TestSameVisibleCoversEveryField fails when a field is added to Worker
// without deciding whether routers see it (sameVisible) or it is evidence.
func TestSameVisibleCoversEveryField(t *testing.T) {
	known := []string{"ID", "Spec", "Model", "Type", "Thresholds", "Health", "Load", "LoadRevision",
		"Overloaded", "OverloadReason", "Liveness", "LivenessReason", "ContactSeq", "AgentNode", "WindowShare", "Admission",
		"Evidence", "Revision",
		"key"} // ID's index key, a cache

	typ := reflect.TypeFor[Worker]()
	for i := range typ.NumField() {
		if name := typ.Field(i).Name; !slices.Contains(known, name) {
			t.Errorf("Worker.%s: add it to sameVisible (or to Evidence) and to this list", name)
		}
	}
}
