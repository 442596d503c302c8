package podwatch

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

type recordSink struct {
	mu   sync.Mutex
	pods map[string]Pod
	got  chan struct{}
}

func (s *recordSink) Upsert(_ string, p Pod) {
	s.mu.Lock()
	s.pods[p.Key()] = p
	s.mu.Unlock()
	s.got <- struct{}{}
}
func (s *recordSink) Delete(string, string) {}
func (s *recordSink) Synced(string)         {}

func enginePod(name, ip, rv string) corev1.Pod {
	return corev1.Pod{
		TypeMeta:   metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "inference", Labels: map[string]string{"app": "vllm"}, ResourceVersion: rv},
		Status:     corev1.PodStatus{PodIP: ip, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

// NewClient (what InCluster returns) lists and watches pods through the
// API server's REST paths with the core/v1 scheme alone: the pods listed and
// the pods a watch adds reach the sink, and the selector is sent as the
// server expects it.
func TestRESTClientListsAndWatchesPods(t *testing.T) {
	var mu sync.Mutex
	var selectors []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/namespaces/inference/pods" {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		selectors = append(selectors, r.URL.Query().Get("labelSelector"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") != "true" {
			_ = json.NewEncoder(w).Encode(corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
				ListMeta: metav1.ListMeta{ResourceVersion: "10"}, Items: []corev1.Pod{enginePod("vllm-0", "10.0.0.1", "9")}})
			return
		}
		enc := json.NewEncoder(w)
		if r.URL.Query().Get("sendInitialEvents") == "true" {
			// A streaming list (the informer lists by watch): the
			// listed pods, then the bookmark that ends them.
			_ = enc.Encode(map[string]any{"type": "ADDED", "object": enginePod("vllm-0", "10.0.0.1", "9")})
			_ = enc.Encode(map[string]any{"type": "BOOKMARK", "object": corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
				ObjectMeta: metav1.ObjectMeta{ResourceVersion: "10", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}})
		}
		_ = enc.Encode(map[string]any{"type": "ADDED", "object": enginePod("vllm-1", "10.0.0.2", "11")})
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer api.Close()

	client, err := NewClient(&rest.Config{Host: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	opts := DefaultOptions()
	opts.Namespace, opts.Selector = "inference", "app=vllm"
	sink := &recordSink{pods: map[string]Pod{}, got: make(chan struct{}, 16)}
	w, err := NewWatcher(client, opts, "", "test", sink, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.After(20 * time.Second)
	for {
		sink.mu.Lock()
		n := len(sink.pods)
		sink.mu.Unlock()
		if n == 2 {
			break
		}
		select {
		case <-sink.got:
		case <-deadline:
			t.Fatalf("pods seen: %v", sink.pods)
		}
	}
	for key, url := range map[string]string{"inference/vllm-0": "http://10.0.0.1:8000", "inference/vllm-1": "http://10.0.0.2:8000"} {
		if p := sink.pods[key]; p.Spec == nil || p.Spec.Url != url || !p.Ready {
			t.Errorf("%s: %+v, want a ready worker at %s", key, p, url)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, s := range selectors {
		if s != "app=vllm" {
			t.Errorf("labelSelector %q sent, want %q", s, "app=vllm")
		}
	}
	if len(selectors) == 0 {
		t.Error("no request reached the API server")
	}
}
