package admin

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/protobuf/proto"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// A prefill registered without a bootstrap port takes the one its engine
// reports at /server_info (or /get_server_info); nothing usable keeps it
// unset (routers then send null).
func TestWithBootstrapPort(t *testing.T) {
	for _, tc := range []struct {
		name       string
		serverInfo string // "" answers 404
		getInfo    string
		spec       *smgv1.WorkerSpec
		want       int32 // 0: unset
		untouched  bool
	}{
		{"server_info", `{"disaggregation_bootstrap_port":8998}`, "", &smgv1.WorkerSpec{WorkerType: "prefill"}, 8998, false},
		{"older get_server_info", "", `{"disaggregation_bootstrap_port":9001}`, &smgv1.WorkerSpec{WorkerType: "prefill"}, 9001, false},
		{"null", `{"disaggregation_bootstrap_port":null}`, "", &smgv1.WorkerSpec{WorkerType: "prefill"}, 0, true},
		{"out of range", `{"disaggregation_bootstrap_port":70000}`, "", &smgv1.WorkerSpec{WorkerType: "prefill"}, 0, true},
		{"not json", `<html>`, "", &smgv1.WorkerSpec{WorkerType: "prefill"}, 0, true},
		{"no route", "", "", &smgv1.WorkerSpec{WorkerType: "prefill"}, 0, true},
		{"given port wins", `{"disaggregation_bootstrap_port":8998}`, "", &smgv1.WorkerSpec{WorkerType: "prefill", BootstrapPort: proto.Int32(7000)}, 7000, true},
		{"decode is not asked", `{"disaggregation_bootstrap_port":8998}`, "", &smgv1.WorkerSpec{WorkerType: "decode"}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body := map[string]string{"/server_info": tc.serverInfo, "/get_server_info": tc.getInfo}[r.URL.Path]
				if body == "" {
					http.NotFound(w, r)
					return
				}
				_, _ = w.Write([]byte(body))
			}))
			defer engine.Close()
			svc := &Service{client: engine.Client()}
			spec := proto.Clone(tc.spec).(*smgv1.WorkerSpec)
			spec.Url = engine.URL + "/"
			got := svc.withBootstrapPort(t.Context(), spec)
			if tc.untouched != (got == spec) {
				t.Fatalf("returned the given spec: %v, want %v", got == spec, tc.untouched)
			}
			if got.GetBootstrapPort() != tc.want || (tc.want == 0) != (got.BootstrapPort == nil) {
				t.Fatalf("bootstrap_port = %v, want %d", got.BootstrapPort, tc.want)
			}
			if spec.BootstrapPort != nil && tc.spec.BootstrapPort == nil {
				t.Fatal("the job's spec was changed in place")
			}
		})
	}
}
