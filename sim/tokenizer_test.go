package sim

import (
	"archive/zip"
	"bytes"
	"io"
	"testing"

	"github.com/smg-project/smg/internal/chattemplate"
	"github.com/smg-project/smg/internal/tokenizer"
)

// TestTokenizerDecodesWords: the archive loads with the router's tokenizer
// and template packages, every generated id decodes to its word and a
// space (what the HTTP surface writes), and prompts round-trip.
func TestTokenizerDecodesWords(t *testing.T) {
	data, _ := tokenizerArchive()
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, f := range zr.File {
		rc, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		files[f.Name], _ = io.ReadAll(rc)
		rc.Close()
	}
	tok, err := tokenizer.Load(bytes.NewReader(files["tokenizer.json"]), tokenizer.Options{Config: bytes.NewReader(files["tokenizer_config.json"])})
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != vocabSize() {
		t.Errorf("vocabulary %d, want %d", tok.VocabSize(), vocabSize())
	}
	for i, w := range vocab {
		if got, err := tok.Decode([]uint32{wordID(i)}, true); err != nil || got != w+" " {
			t.Fatalf("id %d decodes to %q (%v), want %q", wordID(i), got, err, w+" ")
		}
	}
	tmpl, err := chattemplate.Load(bytes.NewReader(files["tokenizer_config.json"]))
	if err != nil {
		t.Fatal(err)
	}
	prompt, err := tmpl.Render([]chattemplate.Message{{Role: "user", Content: []byte(`"the man said: héllo 👋"`)}},
		chattemplate.Options{AddGenerationPrompt: true})
	if err != nil || prompt != "user: the man said: héllo 👋\nassistant: " {
		t.Fatalf("prompt %q, %v", prompt, err)
	}
	ids := tok.Encode(prompt)
	if back, err := tok.Decode(ids, false); err != nil || back != prompt {
		t.Fatalf("%q encodes to %v, which decodes to %q (%v)", prompt, ids, back, err)
	}
	if the := tok.Encode(" the"); len(the) != 1 {
		t.Errorf("a vocabulary word is %d tokens, want 1: %v", len(the), the)
	}
}
