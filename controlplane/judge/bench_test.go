package judge

import (
	"testing"
	"time"
)

var sinkBool bool

func BenchmarkCheck(b *testing.B) {
	th := DefaultGatewayThresholds().Resolve(nil)
	b.ReportAllocs()
	var i int64
	for b.Loop() {
		i++
		over, _ := Check(i&15, float64(i&7)/8, th)
		sinkBool = sinkBool != over
	}
}

// fleet builds n workers in assorted states: idle, streaming, deep silent
// piles, engine silence on both wires, remembered failures.
func fleet(n int, r *Rules) []Liveness {
	ls := make([]Liveness, n)
	for i := range ls {
		l := &ls[i]
		l.SetPrefillRate(2000)
		l.Record(t0, Record{Pushed: i%2 == 0, Waiting: int64(i % 5), Silence: time.Duration(i%4) * time.Second, PrefillInHand: int64(i % 3000), StepWire: i%3 == 0}, r)
		l.Routers(t0, RouterObservation{Streams: int64(i % 7), LastProgress: t0.Add(-time.Duration(i%5) * time.Second), PrefillTokens: int64(i % 1000)}, r)
		if i%10 == 0 {
			l.Failure(t0, ConnectionFailure, r)
		}
	}
	return ls
}

// BenchmarkSweep1000 is one liveness sweep over 1,000 workers.
func BenchmarkSweep1000(b *testing.B) {
	r := DefaultLivenessConfig().Rules()
	ls := fleet(1000, &r)
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(SweepInterval)
		for i := range ls {
			if ls[i].Sweep(now, nil, &r).Changed() {
				sinkBool = !sinkBool
			}
		}
	}
}

// BenchmarkRecord is the liveness half of ingesting one pushed record.
func BenchmarkRecord(b *testing.B) {
	r := DefaultLivenessConfig().Rules()
	var l Liveness
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		l.Record(now, Record{Pushed: true, Waiting: 3, StepWire: true}, &r)
	}
}

func TestHotPathsDoNotAllocate(t *testing.T) {
	th := DefaultGatewayThresholds().Resolve(nil)
	r := DefaultLivenessConfig().Rules()
	ls := fleet(100, &r)
	now := t0
	for name, f := range map[string]func(){
		"Check": func() { over, _ := Check(9, 0.5, th); sinkBool = over },
		"Sweep": func() {
			now = now.Add(SweepInterval)
			for i := range ls {
				ls[i].Sweep(now, nil, &r)
			}
		},
		"Record": func() { ls[0].Record(now, Record{Pushed: true, Waiting: 2, Silence: time.Second}, &r) },
		"Routers": func() {
			ls[1].Routers(now, RouterObservation{Streams: 5, LastProgress: now}, &r)
		},
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocs per run, want 0", name, n)
		}
	}
}
