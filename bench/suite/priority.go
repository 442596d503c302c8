package suite

import (
	"bytes"
	"fmt"
	"os"
	"sort"

	"github.com/smg-project/smg/bench"
)

// priorityYAML is the scheduler configuration of the priority runs: two
// tenants by API key; bulk never waits in the router and interactive at most
// 50 ms (a router queue only moves latency): an interactive request that
// finds no slot preempts a bulk request that has not sent its first byte,
// waits, or is refused; bulk finding no slot is refused at once, so bulk
// takes the sheds. Interactive's reservation follows its observed demand
// (reserve_demand, at least 16), so bulk does not take the slots its next
// arrivals need.
const priorityYAML = `
classes:
  system: {reserved: 0}
  interactive: {reserved: 16, reserve_demand: true, queue_size: 64, queue_timeout_secs: 0.05}
  default: {queue_size: 0}
  bulk: {queue_size: 0}
api_keys:
  sk-bench-interactive: chat
  sk-bench-bulk: batch
tenant_policies:
  "auth:chat": {max_class: interactive}
  "auth:batch": {max_class: bulk}
`

// benchMix is the priority mix: half bulk, half interactive.
var benchMix = []bench.PriorityShare{
	{Class: "bulk", Weight: 1, APIKey: "sk-bench-bulk"},
	{Class: "interactive", Weight: 1, APIKey: "sk-bench-interactive"},
}

// PriorityConfigs are the priority-mix configurations: the window
// configuration of one router with the priority scheduler on top.
func PriorityConfigs() []GatewayConfig {
	flags := append(append([]string{}, windowFlags...), "--priority-scheduler-enabled")
	return []GatewayConfig{{Name: "window-priority", Flags: flags, SimArgs: []string{"--flavor", "sglang"},
		SchedulerYAML: priorityYAML, Priorities: benchMix,
		Why: "window-1r with the priority scheduler (capacity = the router's shares): half bulk, half interactive; bulk never waits in the router, interactive at most 50 ms; interactive's reservation (16) follows its demand (`reserve_demand`); interactive preempts bulk before its first byte"}}
}

// schedulerFlags writes a configuration's scheduler YAML into a temporary
// file and returns the flag naming it (none without YAML).
func schedulerFlags(gc GatewayConfig) ([]string, error) {
	if gc.SchedulerYAML == "" {
		return nil, nil
	}
	f, err := os.CreateTemp("", "smg-bench-"+gc.Name+"-*.yaml")
	if err != nil {
		return nil, err
	}
	_, err = f.WriteString(gc.SchedulerYAML)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return []string{"--priority-scheduler-config", f.Name()}, err
}

// writePrioritySection adds the per-class table of the priority runs and the
// issue's target: at 2×, interactive p99 TTFT within 1.3× of its 0.5× value,
// and bulk taking the sheds.
func writePrioritySection(b *bytes.Buffer, rep *OverloadReport) {
	var runs []OverloadRun
	for _, r := range rep.Runs {
		if len(r.ByClass) > 0 {
			runs = append(runs, r)
		}
	}
	if len(runs) == 0 {
		return
	}
	b.WriteString("\nPriority mix (half `bulk`, half `interactive` arrivals; TTFT from the client's send, router waits included):\n\n")
	WritePriorityTable(b, runs)
	for _, r := range runs {
		if r.Load != 2 {
			continue
		}
		low, ok := rep.Run(r.Config, 0.5)
		if !ok {
			continue
		}
		in, in0, bulk := r.ByClass["interactive"], low.ByClass["interactive"], r.ByClass["bulk"]
		ratio := in.TTFT.P99 / in0.TTFT.P99
		fmt.Fprintf(b, "\nTarget (%s at 2×): interactive p99 TTFT %s against %s at 0.5× (%.2f×, target ≤ 1.3×: %s); "+
			"bulk takes the sheds: %d of %d refusals are bulk (%.0f%%; %s in majority), bulk completed %d. "+
			"The interactive half alone offered %.1f req/s, %.0f%% of the measured capacity, so some interactive refusals "+
			"(or waits) cannot be avoided whatever bulk does.\n", r.Config, msStr(in.TTFT.P99), msStr(in0.TTFT.P99), ratio,
			metStr(ratio <= 1.3), bulk.Shed, bulk.Shed+in.Shed, 100*float64(bulk.Shed)/float64(max(1, bulk.Shed+in.Shed)),
			metStr(bulk.Shed > in.Shed), bulk.Completed, in.OfferedRate, 100*in.OfferedRate/rep.Capacity.ReqPerSec)
	}
}

// WritePriorityTable writes one row per class and run.
func WritePriorityTable(b *bytes.Buffer, runs []OverloadRun) {
	b.WriteString("| config | load | class | requests | completed | refused | TTFT p50 | TTFT p99 | goodput tok/s |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		classes := make([]string, 0, len(r.ByClass))
		for c := range r.ByClass {
			classes = append(classes, c)
		}
		sort.Strings(classes)
		for _, c := range classes {
			s := r.ByClass[c]
			fmt.Fprintf(b, "| %s | %.1f× | %s | %d | %d | %d | %s | %s | %.0f |\n", r.Config, r.Load, c, s.Requests, s.Completed,
				s.Shed, msStr(s.TTFT.P50), msStr(s.TTFT.P99), s.Goodput)
		}
	}
}
