package watch

import (
	"context"
	"testing"
	"time"

	"github.com/smg-project/smg/controlplane/registry"
	"github.com/smg-project/smg/controlplane/tenants"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// recvTenants reads st until a tenants relay arrives.
func recvTenants(t *testing.T, st stream) *smgv1.TenantShares {
	t.Helper()
	for {
		if m := recv(t, st); m.GetTenants() != nil {
			return m.GetTenants()
		}
	}
}

// Real gRPC streams: each router's tenant report reaches the others, summed
// per tenant and without their own; a router that leaves takes its tenants
// with it.
func TestTenantsRelayedToOtherRouters(t *testing.T) {
	reg := registry.New(testEpoch, 0)
	put(t, reg, newWorker("w1"))
	h := start(t, reg, Options{HeartbeatInterval: time.Hour, Tenants: tenants.New(), TenantInterval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r1 := h.watch(t, ctx, &smgv1.WatchHello{RouterId: "r1"})
	recv(t, r1)
	ctx2, cancel2 := context.WithCancel(t.Context())
	r2 := h.watch(t, ctx2, &smgv1.WatchHello{RouterId: "r2"})
	recv(t, r2)
	report := func(st stream, us ...*smgv1.TenantUsage) {
		if err := st.Send(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Report{Report: &smgv1.RouterReport{Tenants: us}}}); err != nil {
			t.Fatal(err)
		}
	}
	report(r1, &smgv1.TenantUsage{Tenant: "auth:a", Weight: 1, InFlight: 3, Waiting: 9})
	report(r2, &smgv1.TenantUsage{Tenant: "auth:a", Weight: 1, InFlight: 2}, &smgv1.TenantUsage{Tenant: "auth:b", Weight: 2, InFlight: 4})
	for {
		got := recvTenants(t, r1).GetOthers()
		if len(got) == 2 {
			if a, b := got[0], got[1]; a.Tenant != "auth:a" || a.InFlight != 2 || a.Waiting != 0 || b.Tenant != "auth:b" || b.Weight != 2 || b.InFlight != 4 {
				t.Fatalf("r1 told %v, want r2's tenants alone", got)
			}
			break
		}
	}
	for {
		got := recvTenants(t, r2).GetOthers()
		if len(got) == 1 && got[0].InFlight == 3 && got[0].Waiting == 9 {
			break
		}
	}
	cancel2() // r2 leaves
	for len(recvTenants(t, r1).GetOthers()) != 0 {
	}
}
