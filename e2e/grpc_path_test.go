package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A gRPC engine behind `smg launch`: registered over gRPC, it reaches the
// router through the watch stream as a routing candidate, and the router
// serves it chat completions, plain and streamed, tokenizing with the
// engine's own tokenizer (GetTokenizer) and detokenizing its token stream,
// SGLang's /generate, and embeddings over Embed.
func TestLaunchServesGRPCWorker(t *testing.T) {
	lines := startSims(t, 1, "--grpc-port", "0")
	fields := strings.Fields(lines[0])
	if len(fields) != 2 || !strings.HasPrefix(fields[1], "grpc://") {
		t.Fatalf("sim line %q has no gRPC URL", lines[0])
	}
	grpcURL := fields[1]
	base, _ := startLaunch(t, "launch", []string{grpcURL})
	a := admin{base: base}
	a.waitReady(t, grpcURL)
	a.waitRoutersApplied(t, 1)
	if err := chat(base, 16, false, 30*time.Second).completeJSON(); err != nil {
		t.Errorf("chat completion from the gRPC worker: %v", err)
	}
	if err := chat(base, 16, true, 30*time.Second).completeStream(); err != nil {
		t.Errorf("streamed chat completion from the gRPC worker: %v", err)
	}
	var gen struct {
		Text     string `json:"text"`
		MetaInfo struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"meta_info"`
	}
	if err := postJSON(base+"/generate", `{"text":"hello there","sampling_params":{"max_new_tokens":4}}`, &gen); err != nil ||
		gen.Text == "" || gen.MetaInfo.CompletionTokens == 0 {
		t.Errorf("/generate from the gRPC worker: %v %+v", err, gen)
	}
	var emb struct {
		Data []struct {
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
	}
	if err := postJSON(base+"/v1/embeddings", `{"model":"`+model+`","input":["hello","there"]}`, &emb); err != nil ||
		len(emb.Data) != 2 || len(emb.Data[0].Embedding) == 0 {
		t.Errorf("embeddings from the gRPC worker: %v %+v", err, emb)
	}
}

// postJSON posts body and decodes a 200 answer into out.
func postJSON(url, body string, out any) error {
	resp, err := client.Post(url, "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return &statusError{resp.StatusCode, string(b)}
	}
	return json.Unmarshal(b, out)
}

type statusError struct {
	status int
	body   string
}

func (e *statusError) Error() string { return http.StatusText(e.status) + ": " + e.body }
