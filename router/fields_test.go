package router

import (
	"encoding/json"
	"reflect"
	"testing"
)

var fieldsSeeds = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi \"there\""}],"stream":true,"n":2}`,
	`{"model":"m","prompt":"p","stream":false}`,
	` { "input" : [1, 2, {"a": "}"}] , "model" : null , "n" : null } `,
	`{"text":"t","input_ids":[[1,2],[3]],"stream":null}`,
	`{"Model":"case-blind","MESSAGES":[]}`,
	`{"model":"esc\u0061ped","n":1.5}`,
	`{"model":5}`, `{"stream":"yes"}`, `{"n":1e2}`, `{"n":9223372036854775808}`, `{"n":-3}`,
	`{"model":"dup","model":"last"}`, `{"messages":null}`, `{}`, `[]`, `null`, `"s"`, `{"model":"m"`, ``,
	`{"model":"caf` + "\xc3\xa9" + `"}`, `{"model":"bad` + "\xff" + `"}`, `{"other":{"model":"nested"},"model":"top"}`,
}

// parseFields answers exactly as json.Unmarshal does: the same fields, and an
// error exactly when Unmarshal gives one, with its text.
func FuzzParseFields(f *testing.F) {
	for _, s := range fieldsSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var got, want requestFields
		gotErr := parseFields(body, &got)
		wantErr := json.Unmarshal(body, &want)
		if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
			t.Fatalf("%q: error %v, Unmarshal's %v", body, gotErr, wantErr)
		}
		if gotErr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: fields %+v, Unmarshal's %+v", body, got, want)
		}
	})
}

// The common request takes the walk, not Unmarshal: no allocation but the
// model's string.
func TestParseFieldsWalksCommonRequests(t *testing.T) {
	body := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"Say hello"}],"max_tokens":4,"stream":true}`)
	var f requestFields
	if !walkFields(body, &f) {
		t.Fatal("the walk gave a common request up to Unmarshal")
	}
	if f.Model != "sim-model" || !f.Stream || string(f.Messages) != `[{"role":"user","content":"Say hello"}]` {
		t.Fatalf("fields %+v", f)
	}
	if raceOn {
		return
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = parseFields(body, &f) }); allocs > 1 {
		t.Fatalf("%.0f allocations per parse, want at most 1 (the model)", allocs)
	}
}
