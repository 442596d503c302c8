package sim

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkStreamTokens streams completions from one engine to concurrent
// clients in the same process and reports the tokens per second the clients
// receive. Run it on one core: go test -run ^$ -bench StreamTokens -cpu 1 ./sim/
// One b.N is one token.
func BenchmarkStreamTokens(b *testing.B) {
	for _, clients := range []int{64, 256} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			o := DefaultOptions()
			o.ITL = time.Millisecond
			o.MaxRunningRequests = clients
			o.KVCapacityTokens = 1 << 24
			o.PrefillTokensPerSec = 1e7
			s, err := Start("127.0.0.1:0", o, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients, DisableCompression: true}}
			defer client.CloseIdleConnections()
			const perRequest = 200
			body := fmt.Sprintf(`{"prompt":"benchmark prompt","max_tokens":%d,"stream":true}`, perRequest)
			var received atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for range clients {
				wg.Go(func() {
					for received.Load() < int64(b.N) {
						resp, err := client.Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(body))
						if err != nil {
							b.Error(err)
							return
						}
						br := bufio.NewReaderSize(resp.Body, 64<<10)
						n := int64(0)
						for {
							line, err := br.ReadSlice('\n')
							if err != nil {
								break
							}
							if bytes.HasPrefix(line, []byte(`data: {`)) && !bytes.Contains(line, []byte(`"finish_reason":"`)) {
								n++
							}
						}
						resp.Body.Close()
						if n != perRequest {
							b.Errorf("stream carried %d tokens, want %d", n, perRequest)
							return
						}
						received.Add(n)
					}
				})
			}
			wg.Wait()
			el := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(received.Load())/el.Seconds(), "tokens/s")
		})
	}
}
