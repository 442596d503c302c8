package validate

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/smg-project/smg/internal/testutil"
)

// requireTools turns a missing promtool or prometheus into a failure; CI
// (scripts/check-deploy.sh) sets it, a developer without them gets a skip.
var requireTools = os.Getenv("SMG_REQUIRE_TOOLS") == "1"

func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if requireTools {
			t.Fatalf("%s not found (Debian package 'prometheus'): %v", name, err)
		}
		t.Skipf("%s not found; install Debian's 'prometheus' package or set SMG_REQUIRE_TOOLS=1 to fail", name)
	}
	return p
}

// smgBinary builds the smg binary from this repository once per test run
// (SMG_BIN names a prebuilt one instead).
func smgBinary(t *testing.T) string {
	t.Helper()
	bin, err := testutil.SMGBinary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// start runs bin with args until the test ends (SIGTERM, then kill after 5 s);
// on failure the test log shows the process's stderr.
func start(t *testing.T, name, bin string, args ...string) *testutil.Proc {
	t.Helper()
	p := testutil.StartT(t, name, bin, args...)
	p.Grace = 5 * time.Second
	return p
}

// freePort, eventually and tail are the harness's.
var (
	freePort   = func(t *testing.T) int { t.Helper(); return testutil.FreePort(t) }
	eventually = func(t *testing.T, within time.Duration, what string, check func() error) {
		t.Helper()
		testutil.Eventually(t, within, what, check)
	}
	tail = testutil.Tail
)

// probeClient fetches like kubelet: https probes do not verify the certificate.
var probeClient = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}

// get fetches url and returns the status and body.
func get(ctx context.Context, url string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func wantOK(ctx context.Context, url string) error {
	code, body, err := get(ctx, url)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", url, code, tail(string(body), 200))
	}
	return nil
}

func itoa(i int) string { return strconv.Itoa(i) }
