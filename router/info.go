package router

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// serveModels lists the models of the current snapshot, OpenAI style.
func (r *Router) serveModels(w http.ResponseWriter, _ *http.Request) {
	out := struct {
		Object string       `json:"object"`
		Data   []modelEntry `json:"data"`
	}{Object: "list", Data: []modelEntry{}}
	if v := r.view.Load(); v != nil {
		for _, m := range v.models {
			if m != "" {
				out.Data = append(out.Data, modelEntry{ID: m, Object: "model", OwnedBy: "smg"})
			}
		}
	}
	writeJSON(w, out)
}

// WorkerLoad is one worker's entry in GET /loads.
type WorkerLoad struct {
	WorkerID   string `json:"worker_id"`
	URL        string `json:"url"`
	Model      string `json:"model"`
	WorkerType string `json:"worker_type"`
	Healthy    bool   `json:"healthy"`
	Veto       string `json:"veto,omitempty"` // overload | unreachable | wedged
	VetoReason string `json:"veto_reason,omitempty"`
	// Overloaded shows the overload cause too when a liveness veto outranks it.
	Overloaded     bool    `json:"overloaded,omitempty"`
	OverloadReason string  `json:"overload_reason,omitempty"`
	Waiting        int64   `json:"waiting"`
	Running        int64   `json:"running"`
	TokenUsage     float64 `json:"token_usage"`
	MaxRunning     int64   `json:"max_running,omitempty"`
	// Dispatched is this router's dispatches since the last load report;
	// Load = Waiting + Running + Dispatched, what load-aware policies compare.
	Dispatched      int64 `json:"dispatched_since_report"`
	Load            int64 `json:"load"`
	StreamsInFlight int64 `json:"streams_in_flight"`
	// Held: kept from the previous control plane epoch while the new one
	// refills its registry (docs/ha.md).
	Held bool `json:"held,omitempty"`
	// The running window this router gates the worker on and its share of
	// it, as the control plane sent them (window_share: > 0 rooms, -1 none
	// granted, 0 no allocator).
	AdmissionRooms int64 `json:"admission_rooms,omitempty"`
	WindowShare    int64 `json:"window_share,omitempty"`
	// WindowInFlight is the rooms of the worker's window this router's
	// requests occupy now (gated workers only).
	WindowInFlight int64 `json:"window_in_flight,omitempty"`
	TTFTLoad
}

// LoadsResponse is the body of GET /loads.
type LoadsResponse struct {
	Revision uint64       `json:"revision"`
	Epoch    string       `json:"epoch,omitempty"`
	FailOpen bool         `json:"fail_open"` // vetoes dropped: control plane lost
	Workers  []WorkerLoad `json:"workers"`
}

func (r *Router) serveLoads(w http.ResponseWriter, _ *http.Request) {
	out := LoadsResponse{Workers: []WorkerLoad{}}
	if v := r.view.Load(); v != nil {
		out.Revision, out.Epoch, out.FailOpen = v.revision, v.epoch, v.failOpen
		for i := range v.size() {
			wk, st := v.worker(i), v.states[i]
			typ := wk.Type
			if typ == "" {
				typ = TypeRegular
			}
			d := st.dispatched.Load()
			out.Workers = append(out.Workers, WorkerLoad{
				WorkerID: wk.ID, URL: wk.URL, Model: wk.Model, WorkerType: typ, Healthy: wk.Healthy,
				Veto: wk.Veto.String(), VetoReason: wk.VetoReason, Overloaded: wk.Overloaded, OverloadReason: wk.OverloadReason,
				Waiting: wk.Waiting, Running: wk.Running, TokenUsage: wk.TokenUsage, MaxRunning: wk.MaxRunning,
				Dispatched: d, Load: wk.Waiting + wk.Running + d, StreamsInFlight: st.streams.Load(), Held: wk.Held,
				AdmissionRooms: wk.AdmissionRooms, WindowShare: wk.WindowShare, WindowInFlight: st.gate.InFlight(),
				TTFTLoad: ttftLoad(wk, st),
			})
		}
	}
	writeJSON(w, out)
}

func (r *Router) metricsHandler() http.Handler {
	if r.gatherer == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeError(w, http.StatusNotFound, CodeNotFound, "Metrics are served by the embedding process", 0)
		})
	}
	return promhttp.HandlerFor(r.gatherer, promhttp.HandlerOpts{})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
