package evidence_test

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/smg-project/smg/controlplane/evidence"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/testutil"
)

// CopyLoad copies every field of the schema (random loads built from the
// descriptor: a field added to EngineLoad or RankLoad and not copied fails
// here), into a new load and over a used one.
func TestCopyLoadCopiesEveryField(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	det := proto.MarshalOptions{Deterministic: true}
	var used *smgv1.EngineLoad
	for range 2000 {
		src := &smgv1.EngineLoad{}
		testutil.FillRandom(src, rng)
		b, err := det.Marshal(src)
		if err != nil {
			t.Fatal(err)
		}
		want := &smgv1.EngineLoad{} // src less its unknown fields, which are not copied
		if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, want); err != nil {
			t.Fatal(err)
		}
		wantB, _ := det.Marshal(want)
		for _, dst := range []*smgv1.EngineLoad{nil, used} {
			got := evidence.CopyLoad(dst, src)
			gotB, _ := det.Marshal(got)
			if !bytes.Equal(gotB, wantB) {
				t.Fatalf("copy %v, want %v", got, want)
			}
			used = got
		}
	}
}

// ReportCopy keeps a copy: the caller's load may change after the call,
// and a second report before the flush reuses the pending copy (no
// allocation).
func TestReportCopyKeepsACopy(t *testing.T) {
	in, reg := coalescing(t)
	l := load(2)
	if err := in.ReportCopy("w1", l); err != nil {
		t.Fatal(err)
	}
	l.Ranks[0].WaitingRequests = 3
	if err := in.ReportCopy("w1", l); err != nil {
		t.Fatal(err)
	}
	l.Ranks[0].WaitingRequests = 99 // the caller's again: not the ingester's
	in.Flush()
	if got := reg.Get("w1").Load.GetRanks()[0].GetWaitingRequests(); got != 3 {
		t.Fatalf("flushed waiting = %d, want the second report's 3", got)
	}
	l.Ranks[0].WaitingRequests = 1
	if err := in.ReportCopy("w1", l); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		if err := in.ReportCopy("w1", l); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations per report with a load pending, want 0", n)
	}
	if got := reg.Get("w1").Load.GetRanks()[0].GetWaitingRequests(); got != 3 {
		t.Fatalf("a pending report changed the stored load: waiting %d", got)
	}
	// A flip commits at once, from the copy.
	l.Ranks[0].WaitingRequests = 8
	if err := in.ReportCopy("w1", l); err != nil {
		t.Fatal(err)
	}
	l.Ranks[0].WaitingRequests = 0
	if w := reg.Get("w1"); !w.Overloaded || w.Load.GetRanks()[0].GetWaitingRequests() != 8 || w.Load.GetWaitingRequests() != 8 {
		t.Fatalf("flip not committed from its copy: overloaded %v load %v", w.Overloaded, w.Load)
	}
}
