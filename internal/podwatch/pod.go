package podwatch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// Pod is what discovery knows of one matching engine pod.
type Pod struct {
	Namespace, Name string
	IP              string
	Ready           bool
	// Spec is the worker the pod would be: URL, role, bootstrap port,
	// overload block, pod labels. Nil when the pod cannot be a worker
	// (Problem says why).
	Spec *smgv1.WorkerSpec
	// Problem, when set, keeps the pod out of the registry (two roles).
	Problem string
	// Warnings are bad annotations: logged, and the pod registered without them.
	Warnings []string
}

// Key is the pod's namespace/name.
func (p Pod) Key() string { return p.Namespace + "/" + p.Name }

// podReady reports the pod's Ready condition.
func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false // terminating: the endpoint controller drops it too
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// observe turns a pod matched by the given roles into an observation.
func observe(p *corev1.Pod, roles []string, port int, protocol, source string) Pod {
	obs := Pod{Namespace: p.Namespace, Name: p.Name, IP: p.Status.PodIP, Ready: podReady(p)}
	if len(roles) > 1 {
		obs.Problem = fmt.Sprintf("pod matches several selectors (%s); it is not registered", strings.Join(roles, ", "))
		return obs
	}
	spec := &smgv1.WorkerSpec{
		WorkerType: roles[0],
		Labels:     map[string]string{LabelPod: p.Name, LabelNamespace: p.Namespace, LabelSource: source},
	}
	if obs.IP != "" {
		spec.Url = protocol + "://" + net.JoinHostPort(obs.IP, strconv.Itoa(port))
	}
	if v, ok := p.Annotations[AnnotationBootstrapPort]; ok {
		if roles[0] != "prefill" {
			obs.Warnings = append(obs.Warnings, fmt.Sprintf("annotation %s is only read on prefill pods; ignored", AnnotationBootstrapPort))
		} else if n, err := strconv.Atoi(strings.TrimSpace(v)); err != nil || n < 1 || n > 65535 {
			obs.Warnings = append(obs.Warnings, fmt.Sprintf("annotation %s=%q is not a port number (1-65535); the engine's default bootstrap port is used", AnnotationBootstrapPort, v))
		} else {
			bp := int32(n)
			spec.BootstrapPort = &bp
		}
	}
	if v, ok := p.Annotations[AnnotationOverload]; ok {
		blk, err := ParseOverload(v)
		if err != nil {
			obs.Warnings = append(obs.Warnings, fmt.Sprintf("annotation %s: %v; the gateway thresholds apply", AnnotationOverload, err))
		} else {
			spec.Overload = blk
		}
	}
	obs.Spec = spec
	return obs
}

// ParseOverload reads the overload annotation's JSON strictly: an object with
// only waiting_requests (integer) and token_usage (number). Ranges are
// checked where registration checks them.
func ParseOverload(v string) (*smgv1.OverloadBlock, error) {
	var raw struct {
		WaitingRequests *int32   `json:"waiting_requests"`
		TokenUsage      *float64 `json:"token_usage"`
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(v)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("want JSON like {\"waiting_requests\": 16, \"token_usage\": 0.9}: %v", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("want one JSON object, got trailing data")
	}
	if raw.WaitingRequests == nil && raw.TokenUsage == nil {
		return nil, fmt.Errorf("the block sets neither waiting_requests nor token_usage")
	}
	return &smgv1.OverloadBlock{WaitingRequests: raw.WaitingRequests, TokenUsage: raw.TokenUsage}, nil
}
