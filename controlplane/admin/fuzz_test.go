package admin_test

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/smg-project/smg/controlplane/admin"
	"github.com/smg-project/smg/controlplane/judge"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
	"github.com/smg-project/smg/internal/inproc"
)

// offline fails every engine request at once, so fuzzed registrations end fast.
type offline struct{}

func (offline) RoundTrip(*http.Request) (*http.Response, error) { return nil, errors.New("offline") }

func newService(t testing.TB) (*admin.Service, http.Handler, *registry.Registry) {
	t.Helper()
	reg := registry.New("fuzz", 0)
	g := judge.DefaultGatewayThresholds()
	resolve := func(b *smgv1.OverloadBlock) (judge.Thresholds, error) { return g.Resolve(nil), nil }
	svc := admin.New(reg, admin.Options{RegistrationTimeout: time.Millisecond}, resolve,
		&http.Client{Transport: offline{}}, slog.New(slog.DiscardHandler))
	t.Cleanup(svc.Close)
	h, err := admin.RESTHandlerWith(svc, inproc.New(&smgv1.WorkerService_ServiceDesc, svc, nil))
	if err != nil {
		t.Fatal(err)
	}
	// One registered worker for PATCH and PUT to hit.
	if _, err := reg.Update(func(tx *registry.Txn) error {
		tx.Insert(&registry.Worker{Registered: registry.Registered{ID: "w-known", Spec: &smgv1.WorkerSpec{Url: "http://known:8000",
			Overload: &smgv1.OverloadBlock{WaitingRequests: proto32(4)}}}, State: registry.State{Health: registry.HealthHealthy}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return svc, h, reg
}

func proto32(v int32) *int32 { return &v }

// checkAnswer asserts the contract every admin answer keeps: a known status,
// and on error the JSON error object with a code and a message.
func checkAnswer(t *testing.T, rec *httptest.ResponseRecorder, allowed ...int) {
	t.Helper()
	ok := false
	for _, s := range allowed {
		ok = ok || rec.Code == s
	}
	if !ok {
		t.Fatalf("status %d not in %v: %s", rec.Code, allowed, rec.Body)
	}
	if rec.Code < 300 {
		return
	}
	var body admin.ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error.Code == "" || body.Error.Message == "" {
		t.Fatalf("error answer %d is not the JSON error object: %s", rec.Code, rec.Body)
	}
}

func serve(h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func seeds(f *testing.F) {
	for _, s := range []string{
		`{"url":"http://gpu-small:8000","overload":{"waiting_requests":4,"token_usage":0.7}}`,
		`{"url":"http://a:1","model_id":"m","worker_type":"decode","priority":3,"cost":0.5,"labels":{"k":"v"},"dp_size":2}`,
		`{"url":"http://a:1","load_monitor_interval_secs":-1}`,
		`{"url":"grpc://a:1","connection_mode":"grpc","bootstrap_port":70000}`,
		`{"priority":1,"overload":{}}`, `{"labels":null}`, `{"url":5}`, `{"url":"http://a:1",`, `[]`, `null`, ``, `{"cost":"NaN"}`,
		`{"url":"http://a:1","overload":{"waiting_requests":2147483648}}`, `{"url":"http://a:1","unknown":1}`,
	} {
		f.Add(s)
	}
}

// FuzzCreateWorkerJSON feeds arbitrary bodies to POST /workers and PUT.
func FuzzCreateWorkerJSON(f *testing.F) {
	seeds(f)
	_, h, reg := newService(f)
	f.Fuzz(func(t *testing.T, body string) {
		before := reg.Revision()
		rec := serve(h, http.MethodPost, "/workers", body)
		checkAnswer(t, rec, http.StatusAccepted, http.StatusBadRequest, http.StatusConflict, http.StatusUnprocessableEntity, http.StatusRequestEntityTooLarge)
		if rec.Code != http.StatusAccepted && reg.Revision() != before {
			t.Fatalf("a refused POST changed the workers: %s", body)
		}
		if rec.Code == http.StatusAccepted && rec.Header().Get("Location") == "" {
			t.Fatal("202 without Location")
		}
		rec = serve(h, http.MethodPut, "/workers/w-known", body)
		checkAnswer(t, rec, http.StatusAccepted, http.StatusBadRequest, http.StatusConflict, http.StatusUnprocessableEntity, http.StatusRequestEntityTooLarge)
	})
}

// FuzzUpdateWorkerJSON feeds arbitrary bodies to PATCH: the stored overload
// block never changes, and an accepted PATCH carrying one says it was kept.
func FuzzUpdateWorkerJSON(f *testing.F) {
	seeds(f)
	_, h, reg := newService(f)
	f.Fuzz(func(t *testing.T, body string) {
		rec := serve(h, http.MethodPatch, "/workers/w-known", body)
		checkAnswer(t, rec, http.StatusAccepted, http.StatusBadRequest, http.StatusUnprocessableEntity, http.StatusRequestEntityTooLarge)
		if w := reg.Snapshot().Get("w-known"); w == nil || w.Spec.GetOverload().GetWaitingRequests() != 4 {
			t.Fatalf("PATCH %s changed or removed the overload block", body)
		}
		var raw map[string]json.RawMessage
		if rec.Code == http.StatusAccepted && json.Unmarshal([]byte(body), &raw) == nil {
			if o, ok := raw["overload"]; ok && string(o) != "null" && !strings.Contains(rec.Body.String(), "kept as is") {
				t.Fatalf("PATCH with an overload block did not say it was kept: %s -> %s", body, rec.Body)
			}
		}
	})
}

func TestBodyTooLarge(t *testing.T) {
	_, h, _ := newService(t)
	big := `{"url":"http://a:1","labels":{"k":"` + strings.Repeat("x", admin.MaxBodyBytes) + `"}}`
	rec := serve(h, http.MethodPost, "/workers", big)
	checkAnswer(t, rec, http.StatusRequestEntityTooLarge)
}

func TestUnknownRoute(t *testing.T) {
	_, h, _ := newService(t)
	rec := serve(h, http.MethodPost, "/workers/w-known", "{}")
	checkAnswer(t, rec, http.StatusMethodNotAllowed, http.StatusNotFound)
}
