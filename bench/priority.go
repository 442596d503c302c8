package bench

import (
	"fmt"
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
