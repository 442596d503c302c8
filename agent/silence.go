package agent

import (
	"slices"
	"time"

	"github.com/smg-project/smg/internal/engine"
)

// silenceMeter measures an engine's own silence from its step counter: how
// long it has held requests, running or waiting, without taking a scheduler
// step. Waiting requests count too: a frozen idle engine that receives its
// first requests queues them and runs nothing, and that is silence as well.
// Only wires whose counter moves on every step give a figure; a counter that
// moves once per request, or every so many tokens, is quiet while healthy.
type silenceMeter struct {
	seen    bool
	count   float64
	held    bool      // requests running or waiting at the last poll
	movedAt time.Time // last step, or when held requests appeared
}

// observe returns the silence at now and whether the wire gives one: step
// wires and token-batch wires (SGLang) do; on the latter a long prefill is
// silent too, which the control plane allows for (the record's step_wire is
// false).
func (m *silenceMeter) observe(rep engine.Report, now time.Time) (time.Duration, bool) {
	if !rep.StepWire && !rep.BatchWire {
		*m = silenceMeter{}
		return 0, false
	}
	held := rep.Running() > 0 || rep.Waiting() > 0
	moved := !m.seen || rep.StepCount != m.count
	// Silence counts only while requests are held, from the first poll that
	// saw them: an idle hour must not read as an hour of silence for the
	// request that ends it.
	if moved || !held || !m.held {
		m.movedAt = now
	}
	m.seen, m.count, m.held = true, rep.StepCount, held
	if !held || !now.After(m.movedAt) {
		return 0, true
	}
	return now.Sub(m.movedAt), true
}

// summary is what decides whether a report is a new record: the load the
// control plane judges and routes by, and whether the engine is silent.
// Generation throughput and cache hit rate are left out: they are rates that
// move on every poll of a busy engine and would turn every poll into a record.
type summary struct {
	source     engine.Source
	stepWire   bool
	silent     bool
	maxRunning int64
	start      float64 // process start time: a restart is a new record even when the figures stay
	ranks      []rankSummary
}

type rankSummary struct {
	dp               int
	waiting, running int64
	tokenUsage       float64
	maxRunning       int64
}

func summarize(rep engine.Report, silent bool) summary {
	s := summary{source: rep.Source, stepWire: rep.StepWire, silent: silent, maxRunning: rep.MaxRunning(),
		start: rep.StartTime, ranks: make([]rankSummary, len(rep.Ranks))}
	for i, r := range rep.Ranks {
		s.ranks[i] = rankSummary{dp: r.DPRank, waiting: r.Waiting, running: r.Running, tokenUsage: r.TokenUsage, maxRunning: r.MaxRunning}
	}
	return s
}

func (s summary) equal(o summary) bool {
	return s.source == o.source && s.stepWire == o.stepWire && s.silent == o.silent &&
		s.maxRunning == o.maxRunning && s.start == o.start && slices.Equal(s.ranks, o.ranks)
}
