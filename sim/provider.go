package sim

import (
	"crypto/subtle"
	"net/http"
	"strconv"
	"strings"
)

// provider makes the engine answer as a hosted provider does where it
// differs from an engine: a request without the API key (Options.APIKey)
// gets 401, and a throttled one (Fault.Throttle) 429 with Retry-After.
// /health and /sim/* stay open, so tests still drive the engine.
func (s *Server) provider(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" || strings.HasPrefix(r.URL.Path, "/sim/") {
			h.ServeHTTP(w, r)
			return
		}
		if key := s.opts.APIKey; key != "" {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(key)) != 1 {
				// As OpenAI does, the answer echoes the start of the key it got.
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = w.Write([]byte(`{"error":{"message":"Incorrect API key provided: ` + echo(got) +
					`","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`))
				return
			}
		}
		if secs := s.throttle.Load(); secs > 0 && r.Method == http.MethodPost {
			w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
			writeError(w, http.StatusTooManyRequests, "Rate limit reached: retry after "+strconv.FormatInt(secs, 10)+" s")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// echo is the start of a key as a provider's 401 shows it, JSON-safe.
func echo(key string) string {
	if len(key) > 6 {
		key = key[:6]
	}
	return strings.Map(func(r rune) rune {
		if r < ' ' || r == '"' || r == '\\' || r > '~' {
			return '?'
		}
		return r
	}, key) + "***"
}
