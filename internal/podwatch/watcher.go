package podwatch

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Client lists and watches the pods of a namespace. InCluster's speaks to
// the API server through client-go's REST client with a scheme of core/v1
// alone: the typed clientsets link client-go's fakes and testing package
// (through gentype) and every API group into smg. Tests adapt a fake
// clientset (podwatchtest.Fake).
type Client interface {
	ListPods(ctx context.Context, namespace string, o metav1.ListOptions) (*corev1.PodList, error)
	WatchPods(ctx context.Context, namespace string, o metav1.ListOptions) (watch.Interface, error)
}

// InCluster returns a client with the pod's service account credentials.
func InCluster() (Client, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("--service-discovery needs to run in a Kubernetes pod with a service account: %w", err)
	}
	c, err := NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("--service-discovery: %w", err)
	}
	return c, nil
}

// NewClient returns a Client for the API server cfg names.
func NewClient(cfg *rest.Config) (Client, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c := rest.CopyConfig(cfg)
	c.APIPath = "/api"
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, err
	}
	return restClient{rc: rc, params: runtime.NewParameterCodec(scheme)}, nil
}

type restClient struct {
	rc     *rest.RESTClient
	params runtime.ParameterCodec
}

func (c restClient) ListPods(ctx context.Context, ns string, o metav1.ListOptions) (*corev1.PodList, error) {
	var list corev1.PodList
	err := c.rc.Get().Namespace(ns).Resource("pods").VersionedParams(&o, c.params).Do(ctx).Into(&list)
	return &list, err
}

func (c restClient) WatchPods(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
	o.Watch = true
	return c.rc.Get().Namespace(ns).Resource("pods").VersionedParams(&o, c.params).Watch(ctx)
}

// Sink hears of every matching pod. Calls come from one goroutine.
type Sink interface {
	// Upsert is the latest state of a pod matched by a selector.
	Upsert(source string, pod Pod)
	// Delete says the pod is gone or matches no selector any more.
	Delete(source, key string)
	// Synced says every pod of the first list has been delivered; pods the
	// sink holds for this source and never heard of since are gone.
	Synced(source string)
}

// Watcher runs one informer per role and feeds the sink.
type Watcher struct {
	opts   Options
	node   string
	source string
	sink   Sink
	log    *slog.Logger

	informers []cache.SharedIndexInformer
	roles     []roleInformer
	queue     *workqueue.Typed[string]
}

type roleInformer struct {
	Role
	store cache.Store
	sync  cache.InformerSynced
}

// NewWatcher builds the informers; node, when set, limits them to the pods
// of that node (spec.nodeName, for an agent). source names the watcher in
// the sink's calls and on the workers' labels.
func NewWatcher(client Client, opts Options, node, source string, sink Sink, log *slog.Logger) (*Watcher, error) {
	roles, err := opts.Roles()
	if err != nil {
		return nil, err
	}
	if len(roles) == 0 {
		return nil, fmt.Errorf("service discovery needs at least one selector")
	}
	w := &Watcher{opts: opts, node: node, source: source, sink: sink, log: log, queue: workqueue.NewTyped[string]()}
	for _, r := range roles {
		tweak := func(o *metav1.ListOptions) {
			o.LabelSelector = r.Selector.String()
			if node != "" {
				o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
			}
		}
		lw := &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				tweak(&o)
				return client.ListPods(ctx, opts.Namespace, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				tweak(&o)
				return client.WatchPods(ctx, opts.Namespace, o)
			},
		}
		// The client says whether it lists by watch (a fake clientset does not).
		inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client), &corev1.Pod{}, opts.Resync, cache.Indexers{})
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    w.enqueue,
			UpdateFunc: func(_, obj any) { w.enqueue(obj) },
			DeleteFunc: w.enqueue,
		}); err != nil {
			return nil, err
		}
		w.informers = append(w.informers, inf)
		w.roles = append(w.roles, roleInformer{Role: r, store: inf.GetStore(), sync: inf.HasSynced})
	}
	return w, nil
}

func (w *Watcher) enqueue(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		w.log.Warn("Service discovery: object without a key", "error", err)
		return
	}
	w.queue.Add(key)
}

// Run lists and watches until ctx ends. Relisting after a broken watch or
// 410 Gone is the informers' own.
func (w *Watcher) Run(ctx context.Context) {
	defer w.queue.ShutDown()
	var running sync.WaitGroup
	for _, inf := range w.informers {
		running.Add(1)
		go func() { defer running.Done(); inf.RunWithContext(ctx) }()
	}
	defer running.Wait()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for w.next() {
		}
	}()
	syncs := make([]cache.InformerSynced, 0, len(w.roles))
	for _, r := range w.roles {
		syncs = append(syncs, r.sync)
	}
	if cache.WaitForCacheSync(ctx.Done(), syncs...) {
		// Synced goes through the queue, so it follows every listed pod.
		w.queue.Add(syncedKey)
		w.log.Info("Service discovery: pods listed", "source", w.source, "namespace", w.opts.Namespace, "node", w.node)
	}
	<-ctx.Done()
	w.queue.ShutDown()
	<-done
}

// syncedKey is no pod's key (keys are namespace/name).
const syncedKey = "\x00synced"

func (w *Watcher) next() bool {
	key, quit := w.queue.Get()
	if quit {
		return false
	}
	defer w.queue.Done(key)
	if key == syncedKey {
		w.sink.Synced(w.source)
		return true
	}
	if pod, ok := w.observe(key); ok {
		w.sink.Upsert(w.source, pod)
	} else {
		w.sink.Delete(w.source, key)
	}
	return true
}

// observe finds the freshest copy of the pod in any role's store and checks
// every selector against its labels (the stores may lag one another while a
// relabelled pod moves between roles).
func (w *Watcher) observe(key string) (Pod, bool) {
	var newest *corev1.Pod
	for _, r := range w.roles {
		obj, ok, _ := r.store.GetByKey(key)
		if !ok {
			continue
		}
		if p, ok := obj.(*corev1.Pod); ok && (newest == nil || newer(p, newest)) {
			newest = p
		}
	}
	if newest == nil || (w.node != "" && newest.Spec.NodeName != w.node) {
		return Pod{}, false
	}
	var roles []string
	set := labels.Set(newest.Labels)
	for _, r := range w.roles {
		if r.Selector.Matches(set) {
			roles = append(roles, r.WorkerType)
		}
	}
	if len(roles) == 0 {
		return Pod{}, false
	}
	return observe(newest, roles, w.opts.Port, cmp.Or(w.opts.Protocol, "http"), w.source), true
}

func newer(a, b *corev1.Pod) bool {
	ra, errA := strconv.ParseUint(a.ResourceVersion, 10, 64)
	rb, errB := strconv.ParseUint(b.ResourceVersion, 10, 64)
	return errA == nil && errB == nil && ra > rb
}
