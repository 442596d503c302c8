// Command bigpages serves n fake engines on consecutive loopback ports, each
// answering /metrics with a valid vLLM page padded to -size bytes of series,
// /v1/models and /health: the engines of the memory probe in
// docs/security.md.
//
//	go run ./bench/cmd/bigpages -n 20 -port 19000 -size 15728640 [-long]
package main

import (
	"bytes"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
)

func main() {
	n := flag.Int("n", 20, "engines")
	port := flag.Int("port", 19000, "first port")
	size := flag.Int("size", 15<<20, "page bytes")
	long := flag.Bool("long", false, "series of about 170 bytes (under 100,000 lines in 16 MiB)")
	flag.Parse()
	var b bytes.Buffer
	b.WriteString("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 0\n")
	b.WriteString("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 1\n")
	b.WriteString("# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.1\n")
	b.WriteString("# TYPE pad gauge\n")
	for i := 0; b.Len() < *size; i++ {
		if *long {
			b.WriteString("pad{model_name=\"meta-llama/Llama-3.1-70B-Instruct\",engine=\"" + strconv.Itoa(i) + "\",le=\"0.005\",x=\"yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy\"} 1\n")
			continue
		}
		b.WriteString("pad{a=\"" + strconv.Itoa(i) + "\"} 1\n")
	}
	page := b.Bytes()
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(page) })
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
	})
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {})
	errs := make(chan error)
	for i := range *n {
		go func() { errs <- http.ListenAndServe("127.0.0.1:"+strconv.Itoa(*port+i), mux) }()
	}
	fmt.Fprintln(os.Stderr, <-errs)
	os.Exit(1)
}
