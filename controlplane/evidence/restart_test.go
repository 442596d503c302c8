package evidence

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// A coalescing inbox commits a load whose start time says the engine
// restarted at once, bumping ContactSeq and logging the old and new start
// time; an untrusted start time is logged once and bumps nothing.
func TestRestartCommitsAtOnceAndIsLogged(t *testing.T) {
	_, reg, _ := setup(t, registry.HealthHealthy)
	var buf bytes.Buffer
	tr := New(reg, Options{Rules: judge.DefaultLivenessConfig(), Coalesce: true}, slog.New(slog.NewTextHandler(&buf, nil)), prometheus.NewRegistry())
	load := func(start float64) *smgv1.EngineLoad {
		return &smgv1.EngineLoad{Source: "vllm", Ranks: []*smgv1.RankLoad{{RunningRequests: 1}},
			ProcessStartTimeSeconds: start, ReportedAt: timestamppb.New(t0)}
	}
	first, again := float64(t0.Unix()-3600), float64(t0.Unix()-1)
	if err := tr.ReportCopy("w1", load(first)); err != nil {
		t.Fatal(err)
	}
	tr.Flush()
	seq := reg.Get("w1").ContactSeq
	if err := tr.ReportCopy("w1", load(again)); err != nil {
		t.Fatal(err)
	}
	if w := reg.Get("w1"); w.ContactSeq != seq+1 || w.Evidence.StartTime != again {
		t.Fatalf("before any flush: contact_seq %d, start %v; want %d and %v", w.ContactSeq, w.Evidence.StartTime, seq+1, again)
	}
	if !strings.Contains(buf.String(), "Engine restarted") || !strings.Contains(buf.String(), "worker_id=w1") {
		t.Fatalf("no restart log line naming the worker:\n%s", buf.String())
	}
	for range 3 {
		if err := tr.ReportCopy("w1", load(first)); err != nil { // backwards: a liar
			t.Fatal(err)
		}
		tr.Flush()
	}
	if w := reg.Get("w1"); w.ContactSeq != seq+1 || w.Evidence.StartTime != again {
		t.Fatalf("a start time going backwards moved the worker: contact_seq %d, start %v", w.ContactSeq, w.Evidence.StartTime)
	}
	if n := strings.Count(buf.String(), "Engine start time not trusted"); n != 1 {
		t.Fatalf("%d lines for the untrusted start time, want 1:\n%s", n, buf.String())
	}
}
