// Package identity lets smg's own HTTP ports say what they are, so that the
// control plane can refuse to register a router or a control plane as a
// worker (a routing loop) and routers can mark the requests they forward.
//
// It only marks and recognizes; refusing a registration is the admin API's
// decision.
package identity

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Path is where every smg HTTP port answers {"smg": "<component>"}.
const Path = "/smg/identity"

// HopHeader marks a request forwarded by an smg router. A router refuses a
// request that carries it (508 loop_detected): it has already been routed.
const HopHeader = "X-SMG-Hop"

// Components that answer on Path.
const (
	Router       = "router"
	ControlPlane = "controlplane"
)

// Handler answers Path for component.
func Handler(component string) http.Handler {
	body := []byte(`{"smg":"` + component + `"}`)
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
}

// Probe asks baseURL what it is. It returns the component when the URL
// answers as an smg port, "" when it answers as something else (an engine),
// and an error when it does not answer at all.
func Probe(ctx context.Context, client *http.Client, baseURL string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(baseURL, "/")+Path, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", nil
	}
	var v struct {
		SMG string `json:"smg"`
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", Path, err)
	}
	if json.Unmarshal(body, &v) != nil {
		return "", nil
	}
	return v.SMG, nil
}
