package jsonstr

import (
	"encoding/json"
	"testing"
)

// What Append writes is a JSON string that decodes to the input (invalid
// UTF-8 aside, which becomes U+FFFD as encoding/json does).
func FuzzAppend(f *testing.F) {
	for _, s := range []string{"", "sim-model", "a\"b\\c\n\r\t\x01", "héllo ✓", "\xff\xfe", "</script>&"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var got string
		if err := json.Unmarshal(Append(nil, s), &got); err != nil {
			t.Fatalf("Append(%q) is not a JSON string: %v", s, err)
		}
		want, _ := json.Marshal(s)
		var wantS string
		_ = json.Unmarshal(want, &wantS)
		if got != wantS {
			t.Fatalf("Append(%q) decodes to %q, want %q", s, got, wantS)
		}
	})
}

func TestAppendKeepsTextAsIs(t *testing.T) {
	if got := string(Append([]byte("x="), "<a & b>")); got != `x="<a & b>"` {
		t.Fatalf("got %s: HTML characters must not be escaped", got)
	}
}
