package monitor_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/smg-project/smg/controlplane/monitor"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

func secs(v int32) *int32 { return &v }

func w(id, model, typ, mode string, override *int32) *registry.Worker {
	return &registry.Worker{Registered: registry.Registered{ID: id, Model: model, Type: typ, Spec: &smgv1.WorkerSpec{Url: "http://" + id, ConnectionMode: mode, LoadMonitorIntervalSecs: override}}}
}

func TestGroups(t *testing.T) {
	m := monitor.New(registry.New("e", 0), nil, nil, monitor.Options{Interval: 10 * time.Second}, slog.New(slog.DiscardHandler))
	got := m.Groups([]*registry.Worker{
		w("a", "llama", "regular", "", nil),
		w("b", "llama", "regular", "http", secs(5)),
		w("c", "llama", "regular", "", secs(3)),  // smallest override of the group wins
		w("d", "llama", "decode", "", secs(0)),   // floored to 1 s
		w("e", "qwen", "regular", "", nil),       // no override: the gateway interval
		w("f", "llama", "regular", "grpc", nil),  // another connection mode, another group
		w("g", "llama", "prefill", "", secs(30)), // an override above the gateway interval still applies
	})
	want := map[monitor.GroupKey]time.Duration{
		{Model: "llama", Type: "regular", Mode: "http"}: 3 * time.Second,
		{Model: "llama", Type: "decode", Mode: "http"}:  time.Second,
		{Model: "qwen", Type: "regular", Mode: "http"}:  10 * time.Second,
		{Model: "llama", Type: "regular", Mode: "grpc"}: 10 * time.Second,
		{Model: "llama", Type: "prefill", Mode: "http"}: 30 * time.Second,
	}
	if len(got) != len(want) {
		t.Fatalf("groups = %v, want %v", got, want)
	}
	for k, iv := range want {
		if got[k] != iv {
			t.Fatalf("group %+v polls every %s, want %s", k, got[k], iv)
		}
	}
}
