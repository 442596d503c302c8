package agentsvc

import (
	"maps"
	"slices"

	"github.com/smg-project/smg/controlplane/registry"
)

// assignment follows the engines one node's agent must cover: its hello's
// and the workers whose spec names the node, reading only the changes since
// its last update (every load record is a commit), not the fleet.
type assignment struct {
	node   string
	own    []string
	rev    uint64
	primed bool
	byID   map[string]string // worker id → url of workers whose spec names the node
}

// update brings the set up to the registry's current state and returns the
// engine URLs, sorted and without duplicates.
func (a *assignment) update(reg *registry.Registry) []string {
	snap := reg.Snapshot() // first: changes after it are read again next time
	var changes []registry.Change
	ok := false
	if a.primed {
		changes, _, ok = reg.ChangesSince(a.rev)
	}
	if ok {
		for _, c := range changes {
			a.apply(c.WorkerID, snap.Get(c.WorkerID))
		}
	} else {
		clear(a.byID)
		for _, w := range snap.Workers() {
			a.apply(w.ID, w)
		}
	}
	a.rev, a.primed = snap.Revision, true
	urls := slices.Concat(a.own, slices.Collect(maps.Values(a.byID)))
	slices.Sort(urls)
	return slices.Compact(urls)
}

func (a *assignment) apply(id string, w *registry.Worker) {
	if w != nil && w.Spec.GetNode() == a.node {
		a.byID[id] = w.Spec.GetUrl()
	} else {
		delete(a.byID, id)
	}
}
