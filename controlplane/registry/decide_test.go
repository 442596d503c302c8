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
	return &Worker{Registered: Registered{ID: "a", Spec: &smgv1.WorkerSpec{Url: "http://a"}, Thresholds: judge.Thresholds{WaitingRequests: 8}}, State: State{Health: HealthHealthy}}
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
		w.Evidence.Routers = map[string]judge.RouterObservation{"r1": {Streams: 3}}
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

// TestSameVisibleCoversEveryField: a Worker is its parts and nothing else,
// and a change to any field of a part routers see (Registered, State,
// Shares) is a visible change, one to Evidence or Revision is not: a field
// added to a part is compared without being listed anywhere.
func TestSameVisibleCoversEveryField(t *testing.T) {
	typ := reflect.TypeFor[Worker]()
	var parts []string
	for i := range typ.NumField() {
		parts = append(parts, typ.Field(i).Name)
	}
	if want := []string{"Registered", "State", "Shares", "Evidence", "Revision"}; !slices.Equal(parts, want) {
		t.Fatalf("Worker's parts are %v, want %v: place a new field in a part", parts, want)
	}
	base := readyWorker()
	base.Load, base.WindowShare, base.Admission = &smgv1.EngineLoad{}, map[string]int64{"r": 1}, &Admission{Window: 4}
	for _, part := range []string{"Registered", "State", "Shares", "Evidence", "Revision"} {
		pt := typ.FieldByIndex([]int{slices.Index(parts, part)}).Type
		fields := []int{-1} // the part itself, when it is not a struct
		if pt.Kind() == reflect.Struct {
			fields = fields[:0]
			for i := range pt.NumField() {
				fields = append(fields, i)
			}
		}
		for _, i := range fields {
			c := base.Clone()
			f := reflect.ValueOf(c).Elem().FieldByName(part)
			name := part
			if i >= 0 {
				f, name = f.Field(i), part+"."+pt.Field(i).Name
			}
			changeValue(t, f)
			visible := part != "Evidence" && part != "Revision"
			if got := !sameVisible(base, c); got != visible {
				t.Errorf("a change to %s: visible %v, want %v", name, got, visible)
			}
		}
	}
}

// changeValue sets v (settable) to a value it did not hold.
func changeValue(t *testing.T, v reflect.Value) {
	t.Helper()
	if at, ok := v.Addr().Interface().(*time.Time); ok {
		*at = at.Add(time.Second)
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Uint64:
		v.SetUint(v.Uint() + 1)
	case reflect.Float64:
		v.SetFloat(v.Float() + 1)
	case reflect.Pointer:
		n := reflect.New(v.Type().Elem())
		if !v.IsNil() {
			n.Elem().Set(v.Elem())
			changeValue(t, n.Elem())
		}
		v.Set(n)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		m.SetMapIndex(reflect.ValueOf("changed"), reflect.Zero(v.Type().Elem()))
		v.Set(m)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Field(i).CanSet() {
				changeValue(t, v.Field(i))
				return
			}
		}
		// Only unexported fields (judge.Liveness): move it by a rule.
		if l, ok := v.Addr().Interface().(*judge.Liveness); ok {
			l.Failure(t0, judge.ConnectionFailure, &judge.Rules{})
			return
		}
		t.Fatalf("cannot change a %s", v.Type())
	default:
		t.Fatalf("cannot change a %s", v.Type())
	}
}

// An external worker (a provider) has no load feed: evidence that would
// flag an engine, a load over its ceiling or a connection failure with
// silence, never vetoes it, and its liveness evidence is not kept.
func TestExternalWorkerIsNeverFlagged(t *testing.T) {
	r := New("e", 0)
	rules := judge.LivenessConfig{StallSecs: 0, WedgeSecs: 3}.Rules()
	w := put(t, r, func(w *Worker) {
		w.Spec = &smgv1.WorkerSpec{Url: "https://api.example.com/v1#m", Provider: &smgv1.ProviderSpec{Model: "p"}}
		w.Load = &smgv1.EngineLoad{WaitingRequests: 99}
		w.Evidence.Live.Failure(t0, judge.ConnectionFailure, &rules)
		w.Evidence.Routers = map[string]judge.RouterObservation{"r1": {Streams: 3}}
	})
	if w.Overloaded || w.Liveness != smgv1.Veto_VETO_UNSPECIFIED || w.Evidence.Live != (judge.Liveness{}) || w.Evidence.Routers != nil {
		t.Fatalf("external worker judged: overloaded %v liveness %v evidence %+v", w.Overloaded, w.Liveness, w.Evidence)
	}
	if v, _ := w.Veto(); v != smgv1.Veto_VETO_UNSPECIFIED {
		t.Fatalf("external worker vetoed: %v", v)
	}
}
