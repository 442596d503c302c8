package validate

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSpecQueriesAgainstPrometheus starts `smg sim` and `smg launch`, a real
// Prometheus (Debian's) scraping launch every second with alerts.yaml loaded,
// and requires each of the spec's PromQL queries to return series, every
// dashboard query to evaluate, and every alerting rule to evaluate healthy.
func TestSpecQueriesAgainstPrometheus(t *testing.T) {
	promBin := tool(t, "prometheus")
	bin := smgBinary(t)
	ctx := t.Context()

	sim := start(t, "sim", bin, "sim", "--count", "2", "--port", "0")
	var engines []string
	eventually(t, 10*time.Second, "sim prints its engine URLs", func() error {
		engines = engines[:0]
		sc := bufio.NewScanner(strings.NewReader(sim.Stdout()))
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "http://") {
				engines = append(engines, strings.TrimSpace(sc.Text()))
			}
		}
		if len(engines) < 2 {
			return fmt.Errorf("%d engine URLs so far", len(engines))
		}
		return nil
	})
	port := freePort(t)
	args := append([]string{"launch", "--host", "127.0.0.1", "--port", itoa(port), "--grpc-port", "0",
		"--load-monitor-interval", "1", "--worker-urls"}, engines...)
	start(t, "launch", bin, args...)
	smgURL := fmt.Sprintf("http://127.0.0.1:%d", port)
	eventually(t, 20*time.Second, "launch polls the engines", func() error {
		_, page, err := get(ctx, smgURL+"/metrics")
		if err != nil {
			return err
		}
		if !strings.Contains(string(page), "smg_engine_waiting_requests{") {
			return fmt.Errorf("no smg_engine_waiting_requests series yet")
		}
		return nil
	})

	dir := t.TempDir()
	rules, err := filepath.Abs("../prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: smg
    static_configs:
      - targets: ["127.0.0.1:%d"]
`, rules, port)
	write(t, dir, "prometheus.yml", config)
	promPort := freePort(t)
	start(t, "prometheus", promBin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:"+itoa(promPort))
	prom := fmt.Sprintf("http://127.0.0.1:%d", promPort)

	// rate(...[5m]) needs two samples of a series: wait for three scrapes.
	eventually(t, 30*time.Second, "Prometheus scrapes smg launch three times", func() error {
		res, err := query(ctx, prom, `count_over_time(up{job="smg"}[1m]) >= 3 and up{job="smg"} == 1`)
		if err != nil {
			return err
		}
		if len(res) == 0 {
			return fmt.Errorf("fewer than 3 successful scrapes")
		}
		return nil
	})

	t.Run("spec queries return series", func(t *testing.T) {
		queries := specQueries(t)
		for _, q := range queries {
			res, err := query(ctx, prom, q)
			if err != nil {
				t.Errorf("%s: %v", q, err)
				continue
			}
			if len(res) == 0 {
				t.Errorf("spec query returned no series (smg exports nothing it can use):\n%s", q)
				continue
			}
			t.Logf("%d series: %s", len(res), strings.Join(strings.Fields(q), " "))
		}
	})
	t.Run("dashboard queries evaluate", func(t *testing.T) {
		r := strings.NewReplacer("$__rate_interval", "1m", "$model", ".*")
		for _, e := range dashboardExprs(t) {
			if _, err := query(ctx, prom, r.Replace(e)); err != nil {
				t.Errorf("dashboard query %q: %v", e, err)
			}
		}
	})
	t.Run("alerting rules evaluate healthy", func(t *testing.T) {
		eventually(t, 15*time.Second, "every rule evaluated without error", func() error { return rulesHealthy(ctx, prom) })
	})
}

// specQueries reads deploy/prometheus/spec-queries.promql: blocks separated by
// blank lines, comment lines dropped.
func specQueries(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../prometheus/spec-queries.promql")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, block := range strings.Split(string(b), "\n\n") {
		var lines []string
		for _, l := range strings.Split(block, "\n") {
			if s := strings.TrimSpace(l); s != "" && !strings.HasPrefix(s, "#") {
				lines = append(lines, l)
			}
		}
		if len(lines) > 0 {
			out = append(out, strings.Join(lines, "\n"))
		}
	}
	if len(out) != 5 {
		t.Fatalf("spec-queries.promql holds %d queries, the spec has 5", len(out))
	}
	return out
}

type apiResponse struct {
	Status    string          `json:"status"`
	Error     string          `json:"error"`
	ErrorType string          `json:"errorType"`
	Data      json.RawMessage `json:"data"`
}

func api(ctx context.Context, u string) (json.RawMessage, error) {
	_, body, err := get(ctx, u)
	if err != nil {
		return nil, err
	}
	var r apiResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%s: %v: %s", u, err, tail(string(body), 200))
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s", r.ErrorType, r.Error)
	}
	return r.Data, nil
}

// query runs an instant query and returns its vector.
func query(ctx context.Context, prom, q string) ([]json.RawMessage, error) {
	data, err := api(ctx, prom+"/api/v1/query?query="+url.QueryEscape(q))
	if err != nil {
		return nil, err
	}
	var d struct {
		ResultType string            `json:"resultType"`
		Result     []json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, err
	}
	return d.Result, nil
}

func rulesHealthy(ctx context.Context, prom string) error {
	data, err := api(ctx, prom+"/api/v1/rules")
	if err != nil {
		return err
	}
	var d struct {
		Groups []struct {
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return err
	}
	n := 0
	for _, g := range d.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health != "ok" {
				return fmt.Errorf("rule %s: health %q %s", r.Name, r.Health, r.LastError)
			}
		}
	}
	if n == 0 {
		return fmt.Errorf("no rules loaded")
	}
	return nil
}
