package openaigrpc

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/smg-project/smg/internal/enginegrpc"
	"github.com/smg-project/smg/internal/jsonstr"
)

// EngineError is a generation that failed on the engine's side, with the
// OpenAI error it answers.
type EngineError struct {
	Err     error
	Status  int    // the HTTP status of the answer
	Type    string // OpenAI's error type
	Code    string // the gRPC code in snake case ("" for errors that are not a status)
	Message string
	// Retry: another worker may answer (before anything reached the client).
	Retry bool
	// Connection: the transport failed (the unreachable rule's evidence).
	Connection bool
	// Timeout: the engine ran out of time (slow, not gone).
	Timeout bool
	// Canceled: the call was cancelled on this side (the client left).
	Canceled bool
}

func (e *EngineError) Error() string { return e.Message }
func (e *EngineError) Unwrap() error { return e.Err }

// Classify maps a Generate error to the answer the client gets: the gRPC
// status codes to HTTP statuses as an engine's HTTP server answers them.
func Classify(err error) *EngineError {
	var ee *EngineError
	if errors.As(err, &ee) {
		return ee
	}
	if errors.Is(err, context.Canceled) {
		return &EngineError{Err: err, Status: 499, Type: "server_error", Message: err.Error(), Canceled: true}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &EngineError{Err: err, Status: http.StatusGatewayTimeout, Type: "server_error", Message: err.Error(), Timeout: true}
	}
	st, ok := status.FromError(err)
	if !ok {
		return &EngineError{Err: err, Status: http.StatusBadGateway, Type: "server_error", Message: err.Error(), Retry: true}
	}
	e := &EngineError{Err: err, Code: snake(st.Code()), Message: st.Message(), Type: "server_error"}
	switch st.Code() {
	case codes.InvalidArgument, codes.OutOfRange, codes.FailedPrecondition:
		e.Status, e.Type = http.StatusBadRequest, "invalid_request_error"
	case codes.NotFound:
		e.Status, e.Type = http.StatusNotFound, "invalid_request_error"
	case codes.PermissionDenied:
		e.Status, e.Type = http.StatusForbidden, "invalid_request_error"
	case codes.Unauthenticated:
		e.Status, e.Type = http.StatusUnauthorized, "invalid_request_error"
	case codes.ResourceExhausted:
		e.Status, e.Type, e.Retry = http.StatusTooManyRequests, "rate_limit_error", true
	case codes.Unimplemented:
		e.Status = http.StatusNotImplemented
	case codes.DeadlineExceeded:
		e.Status, e.Timeout = http.StatusGatewayTimeout, true
	case codes.Canceled:
		e.Status, e.Canceled = 499, true
	case codes.Unavailable:
		e.Status, e.Retry = http.StatusServiceUnavailable, true
		e.Connection = enginegrpc.IsConnectionFailure(err)
		if e.Connection {
			e.Status = http.StatusBadGateway
		}
	default: // Internal, Unknown, Aborted, DataLoss, AlreadyExists
		e.Status, e.Retry = http.StatusInternalServerError, true
	}
	if enginegrpc.AnswersHTTP(err) {
		e.Status, e.Retry, e.Connection = http.StatusBadGateway, true, false
		e.Message = "the worker answers HTTP/1, not gRPC: " + e.Message
	}
	return e
}

// snake spells a gRPC code as OpenAI error codes are spelled
// (InvalidArgument: invalid_argument).
func snake(c codes.Code) string {
	s := c.String()
	var b strings.Builder
	for i, r := range s {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// AppendErrorBody appends the OpenAI error body of e:
// {"error":{"type":…,"code":…,"message":…,"param":null}}.
func (e *EngineError) AppendErrorBody(b []byte) []byte {
	b = append(b, `{"error":{"type":`...)
	b = jsonstr.Append(b, e.Type)
	b = append(b, `,"code":`...)
	if e.Code == "" {
		b = append(b, "null"...)
	} else {
		b = jsonstr.Append(b, e.Code)
	}
	b = append(b, `,"message":`...)
	b = jsonstr.Append(b, e.Message)
	return append(b, `,"param":null}}`...)
}

// stopper holds back text that may be the start of a stop string and cuts
// the text at the first stop string, which is left out as engines do.
type stopper struct {
	stops   []string
	held    string
	matched string // the stop string that ended the text
}

// feed takes the next text; it returns what may be sent now and whether a
// stop string ended the text.
func (s *stopper) feed(text string) (string, bool) {
	if len(s.stops) == 0 {
		return text, false
	}
	s.held += text
	at := -1
	for _, st := range s.stops {
		if i := strings.Index(s.held, st); i >= 0 && (at < 0 || i < at) {
			at, s.matched = i, st
		}
	}
	if at >= 0 {
		out := s.held[:at]
		s.held = ""
		return out, true
	}
	keep := 0 // the longest tail that begins a stop string
	for _, st := range s.stops {
		for k := min(len(st)-1, len(s.held)); k > keep; k-- {
			if strings.HasSuffix(s.held, st[:k]) {
				keep = k
				break
			}
		}
	}
	out := s.held[:len(s.held)-keep]
	s.held = s.held[len(s.held)-keep:]
	return out, false
}

// rest is the text held back when the generation ended without a stop.
func (s *stopper) rest() string {
	h := s.held
	s.held = ""
	return h
}
