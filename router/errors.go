package router

import (
	"net/http"
	"strconv"

	"github.com/smg-project/smg/internal/jsonstr"
)

// Error codes the router answers with. Each goes in the body's "code" and in
// the X-SMG-Error-Code header.
const (
	CodeShed                  = "worker_overload_protection_shed"
	CodeNoAvailableWorkers    = "no_available_workers"
	CodeModelNotFound         = "model_not_found"
	CodeInvalidJSON           = "invalid_json"
	CodePayloadTooLarge       = "payload_too_large"
	CodeAdmissionQueueFull    = "admission_queue_full"
	CodeAdmissionQueueTimeout = "admission_queue_timeout"
	CodeUpstreamError         = "upstream_error"
	CodeNotFound              = "not_found"
	CodeShuttingDown          = "router_shutting_down"
	CodeLoopDetected          = "loop_detected"
	CodeBodyTimeout           = "request_body_timeout"
	CodeMethodNotAllowed      = "method_not_allowed"
	// CodeContextLength: under --worker-token-budget, a request whose prompt
	// plus expected output exceeds every worker's whole token budget.
	CodeContextLength = "context_length_exceeded"
)

// Reasons of smg_router_refused_total.
const (
	refusedLoop        = "loop"
	refusedBodyTimeout = "body_timeout"
)

// ErrorCodeHeader marks an answer decided by this router. It is written in the
// spec's spelling (not Go's canonical form) and stripped from worker answers.
const ErrorCodeHeader = "X-SMG-Error-Code"

var canonicalErrorCodeHeader = http.CanonicalHeaderKey(ErrorCodeHeader)

// writeError answers with the spec's error shape:
// {"error":{"type":…,"code":…,"message":…,"param":null}}. retryAfter <= 0
// leaves Retry-After out.
func writeError(w http.ResponseWriter, status int, code, message string, retryAfter int) {
	errType := "invalid_request_error"
	switch {
	case status >= 500:
		errType = "server_error"
	case status == http.StatusTooManyRequests:
		errType = "rate_limit_error"
	}
	body := make([]byte, 0, 96+len(code)+len(message))
	body = append(body, `{"error":{"type":"`...)
	body = append(body, errType...)
	body = append(body, `","code":`...)
	body = jsonstr.Append(body, code)
	body = append(body, `,"message":`...)
	body = jsonstr.Append(body, message)
	body = append(body, `,"param":null}}`...)

	h := w.Header()
	h.Del(canonicalErrorCodeHeader)
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	h[ErrorCodeHeader] = []string{code}
	if retryAfter > 0 {
		h["Retry-After"] = []string{strconv.Itoa(retryAfter)}
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeStreamError ends an SSE stream already under way with an error event
// of the same shape, so the client reads an explicit failure.
func writeStreamError(w http.ResponseWriter, code, message string) {
	body := make([]byte, 0, 96+len(code)+len(message))
	body = append(body, `data: {"error":{"type":"server_error","code":`...)
	body = jsonstr.Append(body, code)
	body = append(body, `,"message":`...)
	body = jsonstr.Append(body, message)
	body = append(body, `,"param":null}}`+"\n\n"...)
	_, _ = w.Write(body)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// forModel names the model in an answer's message (" for model 'm'"), or
// nothing for a request that named none: "All workers are overloaded".
func forModel(model string) string {
	if model == "" {
		return ""
	}
	return " for model '" + model + "'"
}
