package controlplane_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/smg-project/smg/controlplane/admin"
	"github.com/smg-project/smg/controlplane/registry"
	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// The spec's curl body, with the engine's URL.
func specBody(url string) string {
	return fmt.Sprintf(`{
    "url": %q,
    "overload": {
      "waiting_requests": 4,
      "token_usage": 0.7
    }
  }`, url)
}

func TestRESTWorkerLifecycle(t *testing.T) {
	h := startCP(t, fastOptions())
	engine := startSim(t, nil)

	// POST: 202, Location, the reference body.
	r := h.do(t, http.MethodPost, "/workers", specBody(engine.URL()))
	if r.status != http.StatusAccepted {
		t.Fatalf("POST /workers = %d %s", r.status, r.body)
	}
	id := admin.WorkerID(engine.URL())
	body := r.json(t)
	if body["status"] != "accepted" || body["worker_id"] != id || body["url"] != engine.URL() ||
		body["location"] != "/workers/"+id || body["message"] == "" {
		t.Fatalf("POST body = %s", r.body)
	}
	if loc := r.header.Get("Location"); loc != "/workers/"+id {
		t.Fatalf("Location = %q", loc)
	}

	h.waitFor(t, "Ready with a load report", func(s *registry.Snapshot) bool {
		w := s.Get(id)
		return w != nil && w.Ready() && w.Load != nil
	})
	if job := h.waitJob(t, id); job.State != "done" {
		t.Fatalf("job = %+v", job)
	}

	// GET /workers: spec with the overload block, engine_load, verdict, health, job status, snake_case.
	r = h.do(t, http.MethodGet, "/workers", "")
	if r.status != http.StatusOK {
		t.Fatalf("GET /workers = %d %s", r.status, r.body)
	}
	for _, field := range []string{`"worker_id"`, `"engine_load"`, `"waiting_requests":`, `"token_usage":`, `"job_status"`,
		`"verdict"`, `"health":"healthy"`, `"overload":{"waiting_requests":4,"token_usage":0.7}`, `"model":"sim-model"`, `"total":1`, `"veto":"none"`} {
		if !strings.Contains(string(compact(r.body)), field) {
			t.Fatalf("GET /workers lacks %s:\n%s", field, r.body)
		}
	}
	if strings.Contains(string(r.body), "UNSPECIFIED") {
		t.Fatalf("GET /workers shows an enum's zero name:\n%s", r.body)
	}
	if strings.Contains(string(r.body), "waitingRequests") || strings.Contains(string(r.body), "workerId") {
		t.Fatalf("responses use the spec's snake_case names:\n%s", r.body)
	}
	if r = h.do(t, http.MethodGet, "/workers?model=sim-model", ""); !strings.Contains(string(r.body), id) {
		t.Fatalf("?model=sim-model misses the worker: %s", r.body)
	}
	if r = h.do(t, http.MethodGet, "/workers?model=other", ""); strings.Contains(string(r.body), id) {
		t.Fatalf("?model=other lists the worker: %s", r.body)
	}

	// GET one.
	r = h.do(t, http.MethodGet, "/workers/"+id, "")
	if r.status != http.StatusOK || !strings.Contains(string(r.body), `"ready": true`) && !strings.Contains(string(compact(r.body)), `"ready":true`) {
		t.Fatalf("GET /workers/{id} = %d %s", r.status, r.body)
	}

	// PATCH labels, priority, cost: 202, stored, overload block untouched.
	r = h.do(t, http.MethodPatch, "/workers/"+id, `{"labels":{"gpu":"a10"},"priority":70,"cost":2.5}`)
	if r.status != http.StatusAccepted || r.header.Get("Location") != "/workers/"+id {
		t.Fatalf("PATCH = %d %s", r.status, r.body)
	}
	w := h.reg.Snapshot().Get(id)
	if w.Spec.GetLabels()["gpu"] != "a10" || w.Spec.GetPriority() != 70 || w.Spec.GetCost() != 2.5 {
		t.Fatalf("PATCH not applied: %v", w.Spec)
	}
	if w.Spec.GetOverload().GetWaitingRequests() != 4 || w.Thresholds.WaitingRequests != 4 {
		t.Fatal("PATCH changed the overload block")
	}

	// PATCH carrying an overload block (the spec: PATCH "cannot change the
	// block and keeps it as is"): the rest applies, the block stays, and the
	// answer says so, naming PUT.
	r = h.do(t, http.MethodPatch, "/workers/"+id, `{"priority":10,"labels":{"gpu":"h100"},"overload":{"waiting_requests":100}}`)
	if r.status != http.StatusAccepted || !strings.Contains(string(r.body), "kept as is") || !strings.Contains(string(r.body), "PUT") {
		t.Fatalf("PATCH with overload = %d %s", r.status, r.body)
	}
	w = h.reg.Snapshot().Get(id)
	if w.Spec.GetPriority() != 10 || w.Spec.GetLabels()["gpu"] != "h100" {
		t.Fatalf("the rest of a PATCH carrying an overload block was lost: %v", w.Spec)
	}
	if w.Spec.GetOverload().GetWaitingRequests() != 4 || w.Thresholds.WaitingRequests != 4 {
		t.Fatalf("PATCH changed the overload block: %v %+v", w.Spec.GetOverload(), w.Thresholds)
	}
	r = h.do(t, http.MethodGet, "/workers/"+id, "")
	if !strings.Contains(string(compact(r.body)), `"overload":{"waiting_requests":4`) {
		t.Fatalf("GET after PATCH does not show the kept block: %s", r.body)
	}

	// PUT: complete spec, registration re-runs, new thresholds.
	r = h.do(t, http.MethodPut, "/workers/"+id, fmt.Sprintf(`{"url":%q,"overload":{"waiting_requests":6}}`, engine.URL()))
	if r.status != http.StatusAccepted || r.header.Get("Location") != "/workers/"+id {
		t.Fatalf("PUT = %d %s", r.status, r.body)
	}
	h.waitFor(t, "new thresholds", func(s *registry.Snapshot) bool {
		w := s.Get(id)
		return w != nil && w.Thresholds.WaitingRequests == 6
	})
	if w := h.reg.Snapshot().Get(id); w.Thresholds.TokenUsage != 0.8 {
		t.Fatalf("an omitted block field falls back to the gateway value: %+v", w.Thresholds)
	}

	// DELETE: 202 with Location, then 404 there.
	r = h.do(t, http.MethodDelete, "/workers/"+id, "")
	if r.status != http.StatusAccepted || r.json(t)["worker_id"] != id ||
		r.header.Get("Location") != "/workers/"+id || r.json(t)["location"] != "/workers/"+id {
		t.Fatalf("DELETE = %d %v %s, want 202 with Location /workers/%s", r.status, r.header, r.body, id)
	}
	r = h.do(t, http.MethodGet, "/workers/"+id, "")
	if r.status != http.StatusNotFound || r.errorCode(t) != "WORKER_NOT_FOUND" {
		t.Fatalf("GET after DELETE = %d %s", r.status, r.body)
	}
	if v, ok := h.gauge(t, "smg_engine_waiting_requests", map[string]string{"worker": engine.URL()}); !ok || v != -1 {
		t.Fatalf("removed worker's smg_engine_waiting_requests = %v (present %v), want -1", v, ok)
	}
}

func compact(b []byte) []byte {
	return []byte(strings.NewReplacer(" ", "", "\n", "").Replace(string(b)))
}

func TestRegistrationFailures(t *testing.T) {
	opts := fastOptions()
	opts.RegistrationTimeout = 500 * 1e6 // 500 ms
	h := startCP(t, opts)
	engine := startSim(t, nil)

	cases := []struct {
		name, body, url, reason string
	}{
		{"out-of-range waiting", fmt.Sprintf(`{"url":%q,"overload":{"waiting_requests":0}}`, engine.URL()), engine.URL(), "overload.waiting_requests"},
		{"out-of-range token usage", fmt.Sprintf(`{"url":%q,"overload":{"token_usage":1.5}}`, engine.URL()), engine.URL(), "overload.token_usage"},
		{"unreachable engine", `{"url":"http://127.0.0.1:1"}`, "http://127.0.0.1:1", "not reachable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(t, http.MethodPost, "/workers", tc.body)
			if r.status != http.StatusAccepted {
				t.Fatalf("POST = %d %s; the spec answers 202 and fails the registration", r.status, r.body)
			}
			id := admin.WorkerID(tc.url)
			job := h.waitJob(t, id)
			if job.State != "failed" || !strings.Contains(job.Message, tc.reason) {
				t.Fatalf("job = %+v, want failed naming %q", job, tc.reason)
			}
			if h.reg.Snapshot().Get(id) != nil {
				t.Fatal("a failed registration added the worker")
			}
			r = h.do(t, http.MethodGet, "/workers/"+id, "")
			if r.status != http.StatusNotFound || r.errorCode(t) != "WORKER_NOT_FOUND" || !strings.Contains(string(r.body), tc.reason) {
				t.Fatalf("GET failed worker = %d %s", r.status, r.body)
			}
			r = h.do(t, http.MethodGet, "/jobs", "")
			if !strings.Contains(string(r.body), `"failed"`) || !strings.Contains(string(r.body), id) {
				t.Fatalf("/jobs does not show the failed job: %s", r.body)
			}
			if !strings.Contains(h.logs.String(), "Worker registration failed") {
				t.Fatal("the failure is logged")
			}
			// A failed job does not block a corrected retry.
			if tc.url == engine.URL() {
				if r := h.do(t, http.MethodPost, "/workers", specBody(engine.URL())); r.status != http.StatusAccepted {
					t.Fatalf("retry = %d %s", r.status, r.body)
				}
				if job := h.waitJob(t, id); job.State != "done" {
					t.Fatalf("retry job = %+v", job)
				}
				if r := h.do(t, http.MethodDelete, "/workers/"+id, ""); r.status != http.StatusAccepted {
					t.Fatalf("cleanup DELETE = %d", r.status)
				}
			}
		})
	}

	// A PUT with an out-of-range block fails and leaves the worker as it was.
	id := h.register(t, specBody(engine.URL()))
	r := h.do(t, http.MethodPut, "/workers/"+id, fmt.Sprintf(`{"url":%q,"overload":{"waiting_requests":-3}}`, engine.URL()))
	if r.status != http.StatusAccepted {
		t.Fatalf("PUT = %d %s", r.status, r.body)
	}
	if job := h.waitJob(t, id); job.State != "failed" {
		t.Fatalf("job = %+v", job)
	}
	if w := h.reg.Snapshot().Get(id); w == nil || w.Thresholds.WaitingRequests != 4 {
		t.Fatal("a failed replacement changed or removed the worker")
	}
}

func TestBadInput(t *testing.T) {
	h := startCP(t, fastOptions())
	engine := startSim(t, nil)
	id := h.register(t, fmt.Sprintf(`{"url":%q}`, engine.URL()))
	before := h.reg.Revision()

	cases := []struct {
		name, method, path, body string
		status                   int
		code, param              string
	}{
		{"malformed JSON", "POST", "/workers", `{"url": "http://x:1",`, 422, "", ""},
		{"wrong type", "POST", "/workers", `{"url": 5}`, 422, "", ""},
		{"malformed PATCH", "PATCH", "/workers/" + id, `{"priority": "high"}`, 422, "", ""},
		{"missing url", "POST", "/workers", `{}`, 400, "BAD_REQUEST", "url"},
		{"invalid url", "POST", "/workers", `{"url":"not a url"}`, 400, "BAD_REQUEST", "url"},
		{"url without host", "POST", "/workers", `{"url":"http://"}`, 400, "BAD_REQUEST", "url"},
		{"negative interval", "POST", "/workers", `{"url":"http://x:1","load_monitor_interval_secs":-1}`, 400, "BAD_REQUEST", "load_monitor_interval_secs"},
		{"grpc url in http mode", "POST", "/workers", `{"url":"grpc://x:1","connection_mode":"http"}`, 400, "BAD_REQUEST", "connection_mode"},
		{"grpcs url bad port", "PUT", "/workers/" + id, `{"url":"grpcs://x:99999"}`, 400, "BAD_REQUEST", "url"},
		{"grpc connection mode", "POST", "/workers", `{"url":"http://x:1","connection_mode":"grpc"}`, 400, "BAD_REQUEST", "connection_mode"},
		{"bad worker type", "POST", "/workers", `{"url":"http://x:1","worker_type":"boss"}`, 400, "BAD_REQUEST", "worker_type"},
		{"negative priority", "PATCH", "/workers/" + id, `{"priority":-1}`, 400, "BAD_REQUEST", "priority"},
		{"negative interval patch", "PATCH", "/workers/" + id, `{"load_monitor_interval_secs":-5}`, 400, "BAD_REQUEST", "load_monitor_interval_secs"},
		{"duplicate url", "POST", "/workers", fmt.Sprintf(`{"url":%q}`, engine.URL()), 409, "WORKER_ALREADY_EXISTS", "url"},
		{"unknown worker GET", "GET", "/workers/w-nope", "", 404, "WORKER_NOT_FOUND", ""},
		{"unknown worker PATCH", "PATCH", "/workers/w-nope", `{"priority":1}`, 404, "WORKER_NOT_FOUND", ""},
		{"unknown worker PUT", "PUT", "/workers/w-nope", `{"url":"http://x:1"}`, 404, "WORKER_NOT_FOUND", ""},
		{"unknown worker DELETE", "DELETE", "/workers/w-nope", "", 404, "WORKER_NOT_FOUND", ""},
		// Hostile input (docs/security.md).
		{"null body", "POST", "/workers", `null`, 400, "BAD_REQUEST", ""},
		{"array body", "POST", "/workers", `[{"url":"http://x:1"}]`, 400, "BAD_REQUEST", ""},
		{"string body", "PUT", "/workers/" + id, `"http://x:1"`, 400, "BAD_REQUEST", ""},
		{"null PATCH", "PATCH", "/workers/" + id, ` null`, 400, "BAD_REQUEST", ""},
		{"empty body", "POST", "/workers", ``, 400, "BAD_REQUEST", ""},
		{"password in url", "POST", "/workers", `{"url":"http://admin:hunter2@x:1"}`, 400, "BAD_REQUEST", "url"},
		{"query in url", "POST", "/workers", `{"url":"http://x:1/?token=hunter2"}`, 400, "BAD_REQUEST", "url"},
		{"port 99999", "POST", "/workers", `{"url":"http://x:99999"}`, 400, "BAD_REQUEST", "url"},
		{"metadata address", "POST", "/workers", `{"url":"http://169.254.169.254"}`, 400, "BAD_REQUEST", "url"},
		{"metadata name", "POST", "/workers", `{"url":"http://metadata.google.internal"}`, 400, "BAD_REQUEST", "url"},
		{"alias: trailing slash", "POST", "/workers", fmt.Sprintf(`{"url":%q}`, engine.URL()+"/"), 409, "WORKER_ALREADY_EXISTS", "url"},
		{"alias: case and slashes", "POST", "/workers", fmt.Sprintf(`{"url":%q}`, strings.ToUpper(engine.URL()[:4])+engine.URL()[4:]+"//"), 409, "WORKER_ALREADY_EXISTS", "url"},
		{"interval beyond an hour", "POST", "/workers", `{"url":"http://x:1","load_monitor_interval_secs":2147483647}`, 400, "BAD_REQUEST", "load_monitor_interval_secs"},
		{"interval beyond an hour patch", "PATCH", "/workers/" + id, `{"load_monitor_interval_secs":3601}`, 400, "BAD_REQUEST", "load_monitor_interval_secs"},
		{"infinite cost", "POST", "/workers", `{"url":"http://x:1","cost":"Infinity"}`, 400, "BAD_REQUEST", "cost"},
		{"NaN cost patch", "PATCH", "/workers/" + id, `{"cost":"NaN"}`, 400, "BAD_REQUEST", "cost"},
		{"huge priority", "POST", "/workers", `{"url":"http://x:1","priority":2000000000}`, 400, "BAD_REQUEST", "priority"},
		{"zero dp_size", "POST", "/workers", `{"url":"http://x:1","dp_size":0}`, 400, "BAD_REQUEST", "dp_size"},
		{"huge max_running_requests", "POST", "/workers", `{"url":"http://x:1","max_running_requests":2147483647}`, 400, "BAD_REQUEST", "max_running_requests"},
		{"zero max_running_requests", "POST", "/workers", `{"url":"http://x:1","max_running_requests":0}`, 400, "BAD_REQUEST", "max_running_requests"},
		{"negative max_running_requests", "PUT", "/workers/" + id, `{"url":"http://x:1","max_running_requests":-4}`, 400, "BAD_REQUEST", "max_running_requests"},
		{"zero max_running_requests patch", "PATCH", "/workers/" + id, `{"max_running_requests":0}`, 400, "BAD_REQUEST", "max_running_requests"},
		{"bootstrap port 70000", "POST", "/workers", `{"url":"http://x:1","bootstrap_port":70000}`, 400, "BAD_REQUEST", "bootstrap_port"},
		{"the control plane itself", "POST", "/workers", fmt.Sprintf(`{"url":%q}`, h.http.URL), 400, "BAD_REQUEST", "url"},
		{"wrong method", "POST", "/loads", ``, 405, "METHOD_NOT_ALLOWED", ""},
		{"wrong method on a worker", "POST", "/workers/" + id, `{}`, 405, "METHOD_NOT_ALLOWED", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(t, tc.method, tc.path, tc.body)
			if r.status != tc.status {
				t.Fatalf("%s %s = %d %s, want %d", tc.method, tc.path, r.status, r.body, tc.status)
			}
			if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Fatalf("Content-Type = %q", ct)
			}
			msg, _ := r.errorField(t, "message").(string)
			if msg == "" {
				t.Fatalf("error without a message: %s", r.body)
			}
			if tc.code != "" && r.errorCode(t) != tc.code {
				t.Fatalf("code = %q, want %q: %s", r.errorCode(t), tc.code, r.body)
			}
			if tc.param != "" && r.errorField(t, "param") != tc.param {
				t.Fatalf("param = %v, want %q: %s", r.errorField(t, "param"), tc.param, r.body)
			}
			if strings.Contains(string(r.body), "hunter2") {
				t.Fatalf("the answer echoes a secret: %s", r.body)
			}
			if tc.status == 405 && r.header.Get("Allow") == "" {
				t.Fatalf("405 without Allow: %v", r.header)
			}
			if tc.status == 422 && !strings.Contains(msg, "proto") && !strings.Contains(msg, "syntax") && !strings.Contains(msg, "invalid") && !strings.Contains(msg, "unexpected") {
				t.Fatalf("422 carries the parser's message, got %q", msg)
			}
		})
	}
	if h.reg.Revision() != before {
		t.Fatal("refused requests changed the registry")
	}
	if n := len(h.reg.Snapshot().Workers()); n != 1 {
		t.Fatalf("%d workers, want the one registered: nothing half-registered remains", n)
	}
	for _, j := range h.reg.Snapshot().Jobs() {
		if j.WorkerID != id {
			t.Fatalf("a refused request left a job: %+v", j)
		}
	}
}

// httpRules reads the REST routes of every admin RPC from the gateway's rules
// (proto/smg/v1/smg_http.yaml), keyed by the RPC's full method name.
func httpRules(t *testing.T) map[string]admin.Route {
	t.Helper()
	data, err := os.ReadFile("../proto/smg/v1/smg_http.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]admin.Route{}
	var selector string
	for _, line := range strings.Split(string(data), "\n") {
		key, val, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "- ")), ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		switch key {
		case "selector":
			svc, method, _ := strings.Cut(strings.TrimPrefix(val, "smg.v1."), ".")
			selector = "/smg.v1." + svc + "/" + method
		case "get", "post", "put", "patch", "delete":
			rules[selector] = admin.Route{Method: strings.ToUpper(key), Path: val}
		}
	}
	return rules
}

// Every admin RPC in WorkerService's descriptor and every REST route of the
// gateway's rules needs the key, but the public ones: a new RPC or route
// cannot be left open. REST checks the key before it reads the body (401,
// not 422).
func TestEveryAdminRouteNeedsTheKey(t *testing.T) {
	opts := fastOptions()
	opts.AdminAPIKey = "s3cret"
	h := startCP(t, opts)
	rules := httpRules(t)
	for _, m := range smgv1.WorkerService_ServiceDesc.Methods {
		full := "/" + smgv1.WorkerService_ServiceDesc.ServiceName + "/" + m.MethodName
		route, ok := rules[full]
		if !ok {
			t.Fatalf("RPC %s has no REST rule in smg_http.yaml", full)
		}
		if pub, isPublic := admin.PublicRoute(full); isPublic && pub != route {
			t.Fatalf("public RPC %s is listed at %v, its REST rule is %v", full, pub, route)
		}
		_, public := admin.PublicRoute(full)
		path := strings.ReplaceAll(route.Path, "{worker_id}", "w-1")
		t.Run(m.MethodName, func(t *testing.T) {
			for _, key := range []string{"", "wrong", "s3cret2", "s3cre"} {
				ctx := context.Background()
				if key != "" {
					ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+key)
				}
				err := h.conn.Invoke(ctx, full, &emptypb.Empty{}, &emptypb.Empty{})
				if got := status.Code(err) == codes.Unauthenticated; got == public {
					t.Fatalf("gRPC %s with key %q: %v (public %v)", full, key, err, public)
				}
				// A body that does not parse: the key is checked first.
				body := ""
				if route.Method != http.MethodGet && route.Method != http.MethodDelete {
					body = "{not json"
				}
				r := h.doKey(t, route.Method, path, body, key)
				if got := r.status == http.StatusUnauthorized; got == public {
					t.Fatalf("%s %s with key %q = %d %s (public %v)", route.Method, path, key, r.status, r.body, public)
				}
				if !public && r.errorCode(t) != admin.CodeUnauthorized {
					t.Fatalf("%s %s: code %q, want %s", route.Method, path, r.errorCode(t), admin.CodeUnauthorized)
				}
			}
			if public {
				return
			}
			good := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer s3cret")
			if err := h.conn.Invoke(good, full, &emptypb.Empty{}, &emptypb.Empty{}); status.Code(err) == codes.Unauthenticated {
				t.Fatalf("gRPC %s with the key: %v", full, err)
			}
			if r := h.doKey(t, route.Method, path, "", "s3cret"); r.status == http.StatusUnauthorized {
				t.Fatalf("%s %s with the key = 401", route.Method, path)
			}
		})
	}
	for full := range rules {
		if _, err := findMethod(full); err != nil {
			t.Fatalf("smg_http.yaml routes %s: %v", full, err)
		}
	}
	// The key is checked before the body is parsed: a malformed or
	// non-object body from an unauthenticated caller is still a 401.
	for _, body := range []string{`{"url":`, `null`, `[1]`} {
		if r := h.doKey(t, "POST", "/workers", body, ""); r.status != http.StatusUnauthorized {
			t.Fatalf("unauthenticated POST %q = %d %s, want 401", body, r.status, r.body)
		}
	}
	// Raw header forms that are not "Bearer <key>".
	req, _ := http.NewRequest(http.MethodGet, h.http.URL+"/workers", nil)
	req.Header.Set("Authorization", "s3cret")
	if resp, err := h.http.Client().Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("bare key without Bearer: %v %v", resp.StatusCode, err)
	}
	if h.reg.Snapshot().Jobs() != nil {
		t.Fatal("an unauthorized POST started a registration")
	}
}

// findMethod looks a full method name up in WorkerService's descriptor.
func findMethod(full string) (string, error) {
	for _, m := range smgv1.WorkerService_ServiceDesc.Methods {
		if "/"+smgv1.WorkerService_ServiceDesc.ServiceName+"/"+m.MethodName == full {
			return m.MethodName, nil
		}
	}
	return "", fmt.Errorf("no such RPC in WorkerService")
}

func TestGRPCWorkerService(t *testing.T) {
	h := startCP(t, fastOptions())
	engine := startSim(t, nil)
	ctx := context.Background()

	created, err := h.grpc.CreateWorker(ctx, &smgv1.CreateWorkerRequest{Spec: &smgv1.WorkerSpec{Url: engine.URL(), Labels: map[string]string{"zone": "a"}}})
	if err != nil || created.GetStatus() != "accepted" {
		t.Fatalf("CreateWorker: %v %v", created, err)
	}
	id := created.GetWorkerId()
	h.waitFor(t, "Ready with a load report", func(s *registry.Snapshot) bool {
		w := s.Get(id)
		return w != nil && w.Ready() && w.Load != nil
	})

	if _, err := h.grpc.CreateWorker(ctx, &smgv1.CreateWorkerRequest{Spec: &smgv1.WorkerSpec{Url: engine.URL()}}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("duplicate: %v", err)
	}
	if _, err := h.grpc.CreateWorker(ctx, &smgv1.CreateWorkerRequest{Spec: &smgv1.WorkerSpec{Url: "ftp://x"}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad url: %v", err)
	}
	if _, err := h.grpc.GetWorker(ctx, &smgv1.GetWorkerRequest{WorkerId: "w-none"}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown: %v", err)
	}
	up, err := h.grpc.UpdateWorker(ctx, &smgv1.UpdateWorkerRequest{WorkerId: id, Update: &smgv1.WorkerUpdate{Priority: proto.Int32(9), Overload: &smgv1.OverloadBlock{}}})
	if err != nil || !strings.Contains(up.GetMessage(), "PUT") {
		t.Fatalf("PATCH overload over gRPC: %v %v", up, err)
	}
	if w := h.reg.Snapshot().Get(id); w.Spec.GetPriority() != 9 || w.Spec.GetOverload() != nil {
		t.Fatalf("PATCH over gRPC: priority %d, overload %v; want 9 and no block", w.Spec.GetPriority(), w.Spec.GetOverload())
	}
	list, err := h.grpc.ListWorkers(ctx, &smgv1.ListWorkersRequest{Model: "sim-model"})
	if err != nil || list.GetTotal() != 1 || list.GetWorkers()[0].GetSpec().GetLabels()["zone"] != "a" {
		t.Fatalf("ListWorkers: %v %v", list, err)
	}
	loads, err := h.grpc.GetLoads(ctx, &smgv1.GetLoadsRequest{})
	if err != nil || len(loads.GetWorkers()) != 1 || loads.GetWorkers()[0].GetEngineLoad() == nil {
		t.Fatalf("GetLoads: %v %v", loads, err)
	}
	if _, err := h.grpc.DeleteWorker(ctx, &smgv1.DeleteWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.grpc.DeleteWorker(ctx, &smgv1.DeleteWorkerRequest{WorkerId: id}); status.Code(err) != codes.NotFound {
		t.Fatalf("second delete: %v", err)
	}
}

func TestLoadsIsPublicAndShowsVerdicts(t *testing.T) {
	h := startCP(t, fastOptions())
	engine := startSim(t, nil)
	id := h.register(t, fmt.Sprintf(`{"url":%q}`, engine.URL()))
	r := h.do(t, http.MethodGet, "/loads", "")
	if r.status != http.StatusOK {
		t.Fatalf("/loads = %d", r.status)
	}
	c := string(compact(r.body))
	for _, f := range []string{`"worker_id":"` + id + `"`, `"engine_load":{`, `"overloaded":false`, `"vetoed":false`, `"waiting_requests":0`} {
		if !strings.Contains(c, f) {
			t.Fatalf("/loads lacks %s: %s", f, r.body)
		}
	}
}

// The engine's api_key is a secret: answers show that one is set, not what it is.
func TestAPIKeyIsRedactedInAnswers(t *testing.T) {
	h := startCP(t, fastOptions())
	engine := startSim(t, nil)
	r := h.do(t, http.MethodPost, "/workers", fmt.Sprintf(`{"url": %q, "api_key": "sekrit"}`, engine.URL()))
	if r.status != http.StatusAccepted {
		t.Fatalf("POST /workers = %d %s", r.status, r.body)
	}
	id := admin.WorkerID(engine.URL())
	h.waitFor(t, "registered", func(s *registry.Snapshot) bool { return s.Get(id) != nil })
	if got := h.cp.Registry.Get(id).Spec.GetApiKey(); got != "sekrit" {
		t.Fatalf("stored api_key = %q, want the registered one", got)
	}
	for _, path := range []string{"/workers", "/workers/" + id} {
		r = h.do(t, http.MethodGet, path, "")
		if strings.Contains(string(r.body), "sekrit") || !strings.Contains(string(r.body), "<redacted>") {
			t.Fatalf("GET %s shows the api_key:\n%s", path, r.body)
		}
	}
}
