package openaigrpc

import "testing"

// TestParseGenerateBatch: /generate answers a list for a batch of prompts
// or n > 1, one object otherwise, as SGLang does.
func TestParseGenerateBatch(t *testing.T) {
	for body, want := range map[string]bool{
		`{"text":"a"}`:                                false,
		`{"text":["a"]}`:                              true,
		`{"input_ids":[1,2]}`:                         false,
		`{"input_ids":[[1,2],[3]]}`:                   true,
		`{"input_ids":[ [1] ]}`:                       true,
		`{"text":"a","sampling_params":{"n":2}}`:      true,
		`{"text":"a","sampling_params":{"n":1}}`:      false,
		`{"text":"a","sampling_params":{"stop":"x"}}`: false,
	} {
		r, err := ParseGenerate([]byte(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if r.batch != want || !r.Native {
			t.Errorf("%s: batch %v, want %v", body, r.batch, want)
		}
	}
}
