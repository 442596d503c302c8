package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/smg-project/smg/internal/engine"
)

func stepReport(steps float64, running int64) engine.Report {
	return engine.Report{Source: engine.SourceVLLM, StepWire: true, StepCount: steps,
		Ranks: []engine.Rank{{Running: running}}}
}

func waitingReport(steps float64, waiting int64) engine.Report {
	return engine.Report{Source: engine.SourceVLLM, StepWire: true, StepCount: steps,
		Ranks: []engine.Rank{{Waiting: waiting}}}
}

func TestSilenceMeter(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	type poll struct {
		at      float64
		rep     engine.Report
		silence time.Duration
		has     bool
	}
	cases := map[string][]poll{
		"stepping engine is never silent": {
			{0, stepReport(10, 2), 0, true}, {1, stepReport(20, 2), 0, true}, {2, stepReport(31, 2), 0, true},
		},
		"frozen with running requests: silence since the last step": {
			{0, stepReport(10, 1), 0, true}, {1, stepReport(11, 1), 0, true},
			{2, stepReport(11, 1), time.Second, true}, {4.5, stepReport(11, 1), 3500 * time.Millisecond, true},
			{5, stepReport(12, 1), 0, true}, // it stepped again
		},
		"idle engine is not silent, and idleness does not count once requests arrive": {
			{0, stepReport(10, 0), 0, true}, {3600, stepReport(10, 0), 0, true},
			{3601, stepReport(10, 1), 0, true}, // first poll holding a request
			{3603, stepReport(10, 1), 2 * time.Second, true},
			{3604, stepReport(10, 0), 0, true}, // nothing held
		},
		"frozen idle engine receiving its first requests: waiting, nothing running, no step": {
			{0, stepReport(10, 0), 0, true}, {60, stepReport(10, 0), 0, true},
			{61, waitingReport(10, 2), 0, true}, // queued, never scheduled
			{65, waitingReport(10, 2), 4 * time.Second, true},
			{66, stepReport(11, 2), 0, true}, // it scheduled them
		},
		"a counter going backwards (restart) is movement": {
			{0, stepReport(100, 1), 0, true}, {1, stepReport(100, 1), time.Second, true}, {2, stepReport(3, 1), 0, true},
		},
		"token-batch wire: no figure at all": {
			{0, engine.Report{Source: engine.SourceSGLangLoads, Ranks: []engine.Rank{{Running: 3}}}, 0, false},
			{9, engine.Report{Source: engine.SourceSGLangLoads, Ranks: []engine.Rank{{Running: 3}}}, 0, false},
		},
	}
	for name, polls := range cases {
		t.Run(name, func(t *testing.T) {
			var m silenceMeter
			for i, p := range polls {
				got, has := m.observe(p.rep, at(p.at))
				if got != p.silence || has != p.has {
					t.Errorf("poll %d at %gs: silence %v (reported %v), want %v (%v)", i, p.at, got, has, p.silence, p.has)
				}
			}
		})
	}
}

func TestSummaryDecidesRecords(t *testing.T) {
	base := engine.Report{Source: engine.SourceVLLM, Ranks: []engine.Rank{{Waiting: 1, Running: 2, TokenUsage: 0.5, GenThroughput: 100}}}
	busier := base
	busier.Ranks = []engine.Rank{{Waiting: 2, Running: 2, TokenUsage: 0.5}}
	faster := base
	faster.Ranks = []engine.Rank{{Waiting: 1, Running: 2, TokenUsage: 0.5, GenThroughput: 140, CacheHitRate: 0.3}}
	if !summarize(base, false).equal(summarize(faster, false)) {
		t.Error("a throughput change alone made a new record")
	}
	if summarize(base, false).equal(summarize(busier, false)) {
		t.Error("a waiting change made no new record")
	}
	if summarize(base, false).equal(summarize(base, true)) {
		t.Error("silence crossing zero made no new record")
	}
	restarted := base
	restarted.StartTime = 1.7e9
	if summarize(base, false).equal(summarize(restarted, false)) {
		t.Error("a new process start time with the same figures made no new record")
	}
}

func TestOptionsValidate(t *testing.T) {
	good := DefaultOptions()
	good.Node = "n1"
	good.EngineURLs = []string{"http://127.0.0.1:8000", "grpc://127.0.0.1:31000", "grpcs://engine.local:31001"}
	if err := good.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for name, c := range map[string]struct {
		mut  func(*Options)
		flag string
	}{
		"no node":             {func(o *Options) { o.Node = "" }, "--node"},
		"bad address":         {func(o *Options) { o.ControlPlane = "localhost" }, "--controlplane"},
		"bad url":             {func(o *Options) { o.EngineURLs = []string{"127.0.0.1:8000"} }, "--engine-urls"},
		"unknown scheme":      {func(o *Options) { o.EngineURLs = []string{"ftp://127.0.0.1:8000"} }, "--engine-urls"},
		"gRPC without port":   {func(o *Options) { o.EngineURLs = []string{"grpc://u:hunter2@127.0.0.1:0"} }, "--engine-urls"},
		"password in url":     {func(o *Options) { o.EngineURLs = []string{"http://u:hunter2@127.0.0.1:8000"} }, "--engine-urls"},
		"port out of range":   {func(o *Options) { o.EngineURLs = []string{"http://127.0.0.1:99999"} }, "--engine-urls"},
		"register nothing":    {func(o *Options) { o.EngineURLs = nil; o.Register = true }, "--register"},
		"zero poll":           {func(o *Options) { o.PollInterval = 0 }, "--poll-interval"},
		"heartbeat too large": {func(o *Options) { o.HeartbeatInterval = 15 * time.Second }, "--heartbeat-interval"},
		"gRPC message limit":  {func(o *Options) { o.GRPCEngineMaxMessageMiB = 2048 }, "--grpc-engine-max-message-mib"},
		"no gRPC messages":    {func(o *Options) { o.GRPCEngineMaxMessageMiB = -1 }, "--grpc-engine-max-message-mib"},
	} {
		o := good
		c.mut(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), c.flag) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: %v, want an error naming %s (and no secret)", name, err, c.flag)
		}
	}
}
