package watch

import (
	"maps"
	"slices"

	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// Spec defaults for a worker registered without them.
const (
	DefaultPriority = 50
	DefaultCost     = 1.0
)

// RoutingWorker is the part of w that routing needs, as the router routerID
// sees it (its own share of a decode worker's window). Every worker is sent,
// ready or not: Healthy carries the health checker's admission and the router
// decides.
func RoutingWorker(w *registry.Worker, routerID string) *smgv1.RoutingWorker {
	spec := w.Spec
	v := viewOf(w)
	return &smgv1.RoutingWorker{
		WorkerId:           w.ID,
		Url:                spec.GetUrl(),
		Model:              w.Model,
		WorkerType:         w.Type,
		Priority:           v.priority,
		Cost:               v.cost,
		Healthy:            w.Ready(),
		Veto:               v.veto,
		VetoReason:         v.vetoReason,
		WaitingRequests:    v.waiting,
		RunningRequests:    v.running,
		TokenUsage:         v.tokenUsage,
		MaxRunningRequests: w.MaxRunning(),
		LoadRevision:       w.LoadRevision,
		BootstrapPort:      spec.GetBootstrapPort(),
		ContactSeq:         w.ContactSeq,
		ApiKey:             spec.GetApiKey(),
		WindowShare:        windowShare(w, routerID),
		AdmissionRooms:     w.Admission.Rooms(),
		Overloaded:         w.Overloaded,
		OverloadReason:     w.OverloadReason,
		Provider:           ProviderRoute(spec.GetProvider()),
		PromptTokensAhead:  w.PromptTokensAhead,
		TokenBudget:        w.Budget.TokenBudget(),
		TokenShare:         tokenShare(w, routerID),
	}
}

// ProviderRoute is what routers need of an external worker's provider
// block (nil for an engine): its key goes as the reference only, and its
// headers sorted by name so the same worker always encodes alike.
func ProviderRoute(p *smgv1.ProviderSpec) *smgv1.ProviderRoute {
	if p == nil {
		return nil
	}
	r := &smgv1.ProviderRoute{Model: p.GetModel(), ApiKeyRef: p.GetApiKeyRef(), TimeoutSecs: p.GetTimeoutSecs(),
		SpillRequestsPerSec: p.GetSpillRequestsPerSec(), SpillTokensPerSec: p.GetSpillTokensPerSec()}
	for _, k := range slices.Sorted(maps.Keys(p.GetHeaders())) {
		r.Headers = append(r.Headers, &smgv1.ProviderHeader{Name: k, Value: p.GetHeaders()[k]})
	}
	return r
}

// view is what RoutingWorker's fields take from w beyond a plain copy:
// the spec's defaults, the veto, the load (RoutingWorker and the direct
// encoding, appendWorker, read it alike).
type view struct {
	priority         int32
	cost             float64
	veto             smgv1.Veto
	vetoReason       string
	waiting, running int64
	tokenUsage       float64
}

func viewOf(w *registry.Worker) view {
	v := view{priority: DefaultPriority, cost: DefaultCost}
	if spec := w.Spec; spec != nil {
		if spec.Priority != nil {
			v.priority = *spec.Priority
		}
		if spec.Cost != nil {
			v.cost = *spec.Cost
		}
	}
	v.veto, v.vetoReason = w.Veto()
	if l := w.Load; l != nil {
		v.waiting = int64(l.GetWaitingRequests())
		v.running = int64(l.GetRunningRequests())
		v.tokenUsage = l.GetTokenUsage()
	}
	return v
}

// windowShare is routerID's share of w's running window as RoutingWorker
// sends it.
func windowShare(w *registry.Worker, routerID string) int64 {
	share := w.WindowShare[routerID]
	if share == 0 && (w.Type == "decode" && w.MaxRunning() > 0 || w.Admission.Rooms() > 0 || registry.SpillBudget(w)) {
		// No share granted to this router (yet): -1 tells it to hold no room
		// (spill nothing), where 0 would let it count against the whole
		// window (budget) alone.
		share = -1
	}
	return share
}

// tokenShare is routerID's share of w's token budget as RoutingWorker sends
// it: -1 when the worker has a budget and this router no share (yet).
func tokenShare(w *registry.Worker, routerID string) int64 {
	share := w.TokenShare[routerID]
	if share == 0 && w.Budget.TokenBudget() > 0 {
		share = -1
	}
	return share
}

// perRouter reports whether routers see w differently (their own shares).
func perRouter(w *registry.Worker) bool { return len(w.WindowShare) > 0 || len(w.TokenShare) > 0 }
