package admin

import (
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error codes of the admin API (facts.md, "Admin API").
const (
	CodeWorkerNotFound      = "WORKER_NOT_FOUND"
	CodeWorkerAlreadyExists = "WORKER_ALREADY_EXISTS"
	CodeBadRequest          = "BAD_REQUEST"
	CodeUnauthorized        = "UNAUTHORIZED"
	CodeConflict            = "REGISTRATION_IN_PROGRESS"
)

// errorDomain marks errors this service raised, so the REST layer can tell
// them from the gateway's own body-decoding errors (422).
const errorDomain = "smg.admin"

func apiError(c codes.Code, reason, field, msg string) error {
	var md map[string]string
	if field != "" {
		md = map[string]string{"field": field}
	}
	return WithInfo(c, errorDomain, reason, md, msg)
}

// WithInfo is the status c with msg and an ErrorInfo of domain.
func WithInfo(c codes.Code, domain, reason string, md map[string]string, msg string) error {
	st := status.New(c, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: domain, Metadata: md}); err == nil {
		st = d
	}
	return st.Err()
}

func errNotFound(id string) error {
	return apiError(codes.NotFound, CodeWorkerNotFound, "", fmt.Sprintf("worker %q not found", id))
}

func errNotFoundFailed(id, reason string) error {
	return apiError(codes.NotFound, CodeWorkerNotFound, "",
		fmt.Sprintf("worker %q is not registered: its registration failed: %s", id, reason))
}

func errExists(url string) error {
	return apiError(codes.AlreadyExists, CodeWorkerAlreadyExists, "url",
		fmt.Sprintf("a worker with url %q already exists", url))
}

func errInProgress(id string) error {
	return apiError(codes.Aborted, CodeConflict, "",
		fmt.Sprintf("a registration of worker %q is already in progress", id))
}

func errBadRequest(field, format string, args ...any) error {
	return apiError(codes.InvalidArgument, CodeBadRequest, field, fmt.Sprintf(format, args...))
}

func errUnauthorized() error {
	return apiError(codes.Unauthenticated, CodeUnauthorized, "",
		"missing or invalid admin key: send 'Authorization: Bearer <key>'")
}

// errorInfo returns the ErrorInfo this service attached to err, if any.
func errorInfo(st *status.Status) *errdetails.ErrorInfo {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == errorDomain {
			return info
		}
	}
	return nil
}

// retryAfter is the Retry-After of a 503 of a replicated control plane: an
// election takes about a second.
var retryAfter = map[string]string{"retry_after": "1"}

// ErrNoLeader refuses a write that was not made because this control plane
// does not lead (and no leader was reachable).
func ErrNoLeader(msg string) error {
	return WithInfo(codes.Unavailable, errorDomain, "NO_LEADER", retryAfter, msg)
}

// ErrOutcomeUnknown answers a write that entered the log but whose commit
// was not seen, because leadership changed: it may be stored.
func ErrOutcomeUnknown(msg string) error {
	return WithInfo(codes.Unavailable, errorDomain, "OUTCOME_UNKNOWN", retryAfter, msg)
}
