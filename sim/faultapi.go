package sim

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"
)

// faultPatch is the body of POST /sim/fault: fields present are set, absent
// ones keep their value; clear resets every fault first; duration undoes the
// fields this call set once it has passed.
type faultPatch struct {
	Engine         json.RawMessage `json:"engine"` // N or "all"
	Clear          bool            `json:"clear"`
	Freeze         *bool           `json:"freeze"`
	SilentMetrics  *bool           `json:"silent_metrics"`
	Slow           *float64        `json:"slow"`
	Reset          *bool           `json:"reset"`
	Kill           *bool           `json:"kill"`
	GarbageMetrics *bool           `json:"garbage_metrics"`
	StallKVEvents  *bool           `json:"stall_kv_events"`
	Throttle       *int            `json:"throttle_retry_after"`
	Duration       string          `json:"duration"` // Go duration, "5s"
}

func (p *faultPatch) apply(f Fault) Fault {
	if p.Clear {
		f = Fault{}
	}
	set := func(dst *bool, v *bool) {
		if v != nil {
			*dst = *v
		}
	}
	set(&f.Freeze, p.Freeze)
	set(&f.SilentMetrics, p.SilentMetrics)
	set(&f.Reset, p.Reset)
	set(&f.Kill, p.Kill)
	set(&f.GarbageMetrics, p.GarbageMetrics)
	set(&f.StallKVEvents, p.StallKVEvents)
	if p.Slow != nil {
		f.Slow = *p.Slow
	}
	if p.Throttle != nil {
		f.Throttle = *p.Throttle
	}
	return f
}

// undo clears, in f, the fields p set.
func (p *faultPatch) undo(f Fault) Fault {
	if p.Freeze != nil {
		f.Freeze = false
	}
	if p.SilentMetrics != nil {
		f.SilentMetrics = false
	}
	if p.Reset != nil {
		f.Reset = false
	}
	if p.Kill != nil {
		f.Kill = false
	}
	if p.GarbageMetrics != nil {
		f.GarbageMetrics = false
	}
	if p.StallKVEvents != nil {
		f.StallKVEvents = false
	}
	if p.Slow != nil {
		f.Slow = 0
	}
	if p.Throttle != nil {
		f.Throttle = 0
	}
	return f
}

// FaultState is one engine's faults as the fault API reports them.
type FaultState struct {
	Engine  int    `json:"engine"`
	URL     string `json:"url"`
	GRPCURL string `json:"grpc_url,omitempty"`
	Fault
}

func (s *Server) handleFault(w http.ResponseWriter, r *http.Request) {
	serveFault(w, r, s.fleet, s)
}

// ControlHandler serves /sim/fault for a whole fleet, with every engine as
// the default scope: mount it on a control port that no fault can close.
func ControlHandler(fleet []*Server) http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("/sim/fault", func(w http.ResponseWriter, r *http.Request) { serveFault(w, r, fleet, nil) })
	return m
}

// serveFault reads or patches the faults of the engines the request names
// (?engine=N|all or the body's "engine"); self is the default, all engines
// when self is nil.
func serveFault(w http.ResponseWriter, r *http.Request, fleet []*Server, self *Server) {
	var p faultPatch
	if r.Method == http.MethodPost {
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
			writeError(w, http.StatusBadRequest, "invalid fault body: "+err.Error())
			return
		}
	} else if r.Method != http.MethodGet {
		writeError(w, http.StatusMethodNotAllowed, "use GET or POST")
		return
	}
	scope := r.URL.Query().Get("engine")
	if scope == "" && len(p.Engine) > 0 {
		var n int
		if json.Unmarshal(p.Engine, &n) == nil {
			scope = strconv.Itoa(n)
		} else if json.Unmarshal(p.Engine, &scope) != nil {
			writeError(w, http.StatusBadRequest, `engine must be a number or "all"`)
			return
		}
	}
	var targets []*Server
	switch {
	case scope == "all" || (scope == "" && self == nil):
		targets = fleet
	case scope == "":
		targets = []*Server{self}
	default:
		n, err := strconv.Atoi(scope)
		if err != nil || n < 0 || n >= len(fleet) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("engine %q: want 0..%d or all", scope, len(fleet)-1))
			return
		}
		targets = []*Server{fleet[n]}
	}
	var d time.Duration
	if p.Duration != "" {
		var err error
		if d, err = time.ParseDuration(p.Duration); err != nil || d <= 0 {
			writeError(w, http.StatusBadRequest, "duration must be a positive Go duration like \"5s\"")
			return
		}
	}
	if p.Slow != nil && *p.Slow < 0 {
		writeError(w, http.StatusBadRequest, "slow must be >= 0")
		return
	}

	mine, _ := r.Context().Value(connKey{}).(net.Conn)
	states := make([]FaultState, 0, len(targets))
	var deferred *Server // killing or resetting the engine carrying this call waits for the answer
	for _, t := range targets {
		if r.Method == http.MethodGet {
			states = append(states, t.faultState())
			continue
		}
		if t == self && (p.Kill != nil && *p.Kill || p.Reset != nil && *p.Reset) {
			deferred = t
			states = append(states, FaultState{t.index, t.URL(), t.GRPCURL(), p.apply(t.Fault())})
			continue
		}
		if err := t.patch(&p, d, nil); err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		states = append(states, t.faultState())
	}
	if deferred != nil {
		w.Header().Set("Connection", "close")
	}
	if len(states) == 1 && scope != "all" && !(scope == "" && self == nil) {
		writeJSON(w, states[0])
	} else {
		writeJSON(w, states)
	}
	if deferred != nil {
		_ = http.NewResponseController(w).Flush()
		_ = deferred.patch(&p, d, mine)
	}
}

func (s *Server) faultState() FaultState {
	return FaultState{Engine: s.index, URL: s.URL(), GRPCURL: s.GRPCURL(), Fault: s.Fault()}
}

// patch applies p now and, with d > 0, undoes it after d.
func (s *Server) patch(p *faultPatch, d time.Duration, keep net.Conn) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.applyLocked(p.apply(s.fault), keep); err != nil {
		return err
	}
	if d > 0 {
		var t *time.Timer
		t = time.AfterFunc(d, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			delete(s.timers, t)
			if err := s.applyLocked(p.undo(s.fault), nil); err != nil {
				s.log.Error("undo fault", "err", err)
			}
		})
		s.timers[t] = struct{}{}
	}
	return nil
}
