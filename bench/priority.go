package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// PriorityMix is a flag value for a priority mix: comma-separated
// class=weight[:api-key] entries, e.g. "bulk=1:sk-batch,interactive=1:sk-chat".
type PriorityMix []PriorityShare

func (m *PriorityMix) String() string {
	var parts []string
	for _, p := range *m {
		e := p.Class + "=" + strconv.FormatFloat(p.Weight, 'g', -1, 64)
		if p.APIKey != "" {
			e += ":" + p.APIKey
		}
		parts = append(parts, e)
	}
	return strings.Join(parts, ",")
}

func (m *PriorityMix) Set(s string) error {
	var out PriorityMix
	for _, e := range strings.Split(s, ",") {
		class, rest, ok := strings.Cut(strings.TrimSpace(e), "=")
		if !ok || class == "" {
			return fmt.Errorf("priority mix entry %q: want class=weight[:api-key]", e)
		}
		w, key, _ := strings.Cut(rest, ":")
		weight, err := strconv.ParseFloat(w, 64)
		if err != nil || !(weight > 0) {
			return fmt.Errorf("priority mix entry %q: the weight must be a number > 0", e)
		}
		out = append(out, PriorityShare{Class: class, Weight: weight, APIKey: key})
	}
	*m = out
	return nil
}

// priorityYAML is the scheduler configuration of the priority runs: two
// tenants by API key; no class waits in the router (a router queue only
// moves latency): an interactive request that finds no slot preempts a bulk
// request that has not sent its first byte, or is refused; bulk finding no
// slot is refused at once, so bulk takes the sheds. A small reservation
// keeps a few slots free for interactive arrivals.
const priorityYAML = `
classes:
  system: {reserved: 0}
  interactive: {reserved: 4, queue_size: 0}
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
var benchMix = []PriorityShare{
	{Class: "bulk", Weight: 1, APIKey: "sk-bench-bulk"},
	{Class: "interactive", Weight: 1, APIKey: "sk-bench-interactive"},
}

// PriorityConfigs are the priority-mix configurations: the window
// configuration of one router with the priority scheduler on top.
func PriorityConfigs() []GatewayConfig {
	flags := append(append([]string{}, windowFlags...), "--priority-scheduler-enabled")
	return []GatewayConfig{{Name: "window-priority", Flags: flags, SimArgs: []string{"--flavor", "sglang"},
		SchedulerYAML: priorityYAML, Priorities: benchMix,
		Why: "window-1r with the priority scheduler (capacity = the router's shares): half bulk, half interactive; no class waits in the router; interactive preempts bulk before its first byte"}}
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
