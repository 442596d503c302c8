package watchclient

import (
	"testing"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// The router's own part of the prompt tokens ahead is taken when the control
// plane sends it, even as 0; a control plane that does not send it leaves
// the router to subtract its latest report.
func TestOwnPromptTokensAheadOnlyWhenSent(t *testing.T) {
	zero, part := int64(0), int64(3000)
	for _, c := range []struct {
		own      *int64
		want     int64
		wantSent bool
	}{{nil, 0, false}, {&zero, 0, true}, {&part, 3000, true}} {
		w := routerWorker(&smgv1.RoutingWorker{WorkerId: "w", PromptTokensAhead: 4000, OwnPromptTokensAhead: c.own})
		if w.PromptTokensAhead != 4000 || w.OwnPromptTokensAhead != c.want || w.OwnAheadSent != c.wantSent {
			t.Errorf("own %v: ahead %d, own %d sent %v; want 4000, %d %v", c.own, w.PromptTokensAhead, w.OwnPromptTokensAhead, w.OwnAheadSent, c.want, c.wantSent)
		}
	}
}
