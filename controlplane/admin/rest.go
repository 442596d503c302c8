package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// MaxBodyBytes bounds an admin request body.
const MaxBodyBytes = 1 << 20

// RESTHandlerWith serves the admin routes of smg_http.yaml with the spec's
// snake_case JSON, in requests and responses, through conn (the control
// plane's in-process channel, through its server's interceptors) behind
// svc's key check, which runs before the body is read.
func RESTHandlerWith(svc *Service, conn grpc.ClientConnInterface) (http.Handler, error) {
	mux := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
			MarshalOptions: protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true},
		}),
		runtime.WithForwardResponseOption(setStatus),
		runtime.WithOutgoingHeaderMatcher(func(key string) (string, bool) {
			switch key {
			case "location":
				return "Location", true
			case "smg-stale": // an answer from a replica that does not lead
				return "X-Smg-Stale", true
			}
			return "", false
		}),
		runtime.WithIncomingHeaderMatcher(func(key string) (string, bool) {
			if strings.EqualFold(key, "X-Smg-Read") { // "local": this replica's view
				return "smg-read", true
			}
			return runtime.DefaultHeaderMatcher(key)
		}),
		runtime.WithErrorHandler(writeError),
		runtime.WithRoutingErrorHandler(routingError),
	)
	if err := smgv1.RegisterWorkerServiceHandlerClient(context.Background(), mux, smgv1.NewWorkerServiceClient(conn)); err != nil {
		return nil, err
	}
	return svc.RequireKey(requireObject(mux)), nil
}

// requireObject refuses, before the gateway decodes it, a body that is not
// a JSON object (null, an array, a string, nothing) or is too large: 400 or
// 413, never a half-read spec. Only the routes that take r's method with a
// body read one (a wrong method gets its 405 from the gateway, body or not).
// It runs after RequireKey, so only an authorised caller gets here.
func requireObject(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m := r.Method; (m == http.MethodPost || m == http.MethodPut || m == http.MethodPatch) && strings.Contains(allowedMethods(r.URL.Path), m) {
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
			if err != nil {
				WriteJSONError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "REQUEST_TOO_LARGE",
					"request body too large or cut: "+err.Error(), nil)
				return
			}
			if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) == 0 || trimmed[0] != '{' {
				WriteJSONError(w, http.StatusBadRequest, "invalid_request_error", CodeBadRequest,
					"the request body must be a JSON object", nil)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		next.ServeHTTP(w, r)
	})
}

// allowedMethods is the Allow header of each admin route, for the 405 of a
// wrong method.
func allowedMethods(path string) string {
	switch {
	case path == "/workers":
		return "GET, POST"
	case strings.HasPrefix(path, "/workers/") && !strings.Contains(path[len("/workers/"):], "/"):
		return "GET, PUT, PATCH, DELETE"
	case path == "/loads", path == "/jobs", path == "/routers":
		return "GET"
	}
	return ""
}

// setStatus applies the status a method asked for (202 for changes).
func setStatus(ctx context.Context, w http.ResponseWriter, _ proto.Message) error {
	md, _ := runtime.ServerMetadataFromContext(ctx) // none: no header, no status
	if v := md.HeaderMD.Get("x-http-code"); len(v) > 0 {
		code, err := strconv.Atoi(v[0])
		if err != nil {
			return err
		}
		delete(md.HeaderMD, "x-http-code")
		w.WriteHeader(code)
	}
	return nil
}

// ErrorBody is the JSON error answer of every smg HTTP route.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the OpenAI-style error object.
type ErrorDetail struct {
	Type    string  `json:"type"`
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
}

// WriteJSONError writes an error answer.
func WriteJSONError(w http.ResponseWriter, httpCode int, typ, code, msg string, param *string) {
	body, _ := json.Marshal(ErrorBody{Error: ErrorDetail{Type: typ, Code: code, Message: msg, Param: param}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpCode)
	_, _ = w.Write(body)
}

// writeError maps a gRPC status to the admin API's HTTP answer. An invalid
// argument this service did not raise comes from decoding the body: 422 with
// the parser's message.
func writeError(_ context.Context, _ *runtime.ServeMux, _ runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	st := status.Convert(err)
	info := errorInfo(st)
	var param *string
	if f := info.GetMetadata()["field"]; f != "" {
		param = &f
	}
	code := runtime.HTTPStatusFromCode(st.Code())
	reason := info.GetReason()
	if ra := info.GetMetadata()["retry_after"]; ra != "" {
		w.Header().Set("Retry-After", ra)
	}
	typ := "invalid_request_error"
	switch {
	case st.Code() == codes.InvalidArgument && info == nil:
		code, reason = http.StatusUnprocessableEntity, "UNPROCESSABLE_ENTITY"
	case st.Code() == codes.Aborted, st.Code() == codes.AlreadyExists:
		code = http.StatusConflict
	case st.Code() == codes.Unauthenticated:
		typ = "authentication_error"
	case st.Code() == codes.Unavailable:
		typ = "server_error"
	case reason == "":
		reason = st.Code().String()
		typ = "server_error"
	}
	WriteJSONError(w, code, typ, reason, st.Message(), param)
}

func routingError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
	switch httpStatus {
	case http.StatusMethodNotAllowed:
		allow := allowedMethods(r.URL.Path)
		if allow != "" {
			w.Header().Set("Allow", allow)
		}
		WriteJSONError(w, httpStatus, "invalid_request_error", "METHOD_NOT_ALLOWED", r.Method+" is not allowed on "+r.URL.Path+"; use "+allow, nil)
	default:
		WriteJSONError(w, http.StatusNotFound, "invalid_request_error", "NOT_FOUND", "no route "+r.Method+" "+r.URL.Path, nil)
	}
}
