package evidence

import (
	"reflect"
	"testing"
	"time"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
)

// A cell's take gives a clone the evidence of its pending records, whether
// it takes the prediction's evidence (the clone's source is the record the
// records were predicted against) or replays the records (it is not): the
// same evidence either way, and each set of records once.
func TestTakeAppliesThePredictionsEvidence(t *testing.T) {
	for _, predicted := range []bool{true, false} {
		tr, reg := coalescing(t)
		base := reg.Get("w1")
		want := base.Evidence
		for i, rec := range []judge.Record{
			{Pushed: true, Waiting: 1, StepWire: true},
			{Pushed: true, Waiting: 3, Silence: time.Second, StepWire: true},
			{Pushed: true, Waiting: 0, Idle: true},
		} {
			at := t0.Add(time.Duration(i) * 50 * time.Millisecond)
			tr.Record("w1", rec, at)
			applyPushed(&want, timedRecord{rec, at}, &tr.rules)
		}
		if _, err := reg.Update(func(txn *registry.Txn) error {
			w := txn.Get("w1")
			src := w
			if !predicted {
				src = w.Clone() // another record than the one predicted against
			}
			c := w.Clone()
			if moved, _ := tr.cell("w1").takeOnto(src, c, &tr.rules); !moved {
				t.Fatal("apply moved nothing")
			}
			if !reflect.DeepEqual(c.Evidence.Live, want.Live) || !c.Evidence.PushedAt.Equal(want.PushedAt) {
				t.Fatalf("predicted %v: evidence %+v, want %+v", predicted, c.Evidence, want)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if ids := pendingIDs(tr); len(ids) != 0 {
			t.Fatalf("records still pending after the take: %v", ids)
		}
	}
}
