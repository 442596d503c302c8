// Package podwatchtest adapts a client-go fake clientset to podwatch.Client
// for tests. Tests only: it links client-go's typed clients and fakes, which
// smg does not (cmd/smg's deps test forbids them).
package podwatchtest

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/smg-project/smg/internal/podwatch"
)

// Fake reads pods from c.
func Fake(c *fake.Clientset) podwatch.Client { return fakeClient{c} }

type fakeClient struct{ c *fake.Clientset }

func (f fakeClient) ListPods(ctx context.Context, ns string, o metav1.ListOptions) (*corev1.PodList, error) {
	return f.c.CoreV1().Pods(ns).List(ctx, o)
}

func (f fakeClient) WatchPods(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
	return f.c.CoreV1().Pods(ns).Watch(ctx, o)
}

// IsWatchListSemanticsUnSupported tells the informer the fake cannot list
// by watch (the fake clientset's own answer).
func (f fakeClient) IsWatchListSemanticsUnSupported() bool {
	return f.c.IsWatchListSemanticsUnSupported()
}
