package sim

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"
	"time"
)

// The simulated model's tokenizer: a word-level Hugging Face tokenizer over
// the simulator's vocabulary, so that token ids streamed over gRPC decode to
// the same words the HTTP surface writes.
const (
	tokUnk      = 0
	tokBOS      = 1
	tokEOS      = 2
	firstWordID = 3
)

// wordID is the token id of vocab[i].
func wordID(i int) uint32 { return uint32(firstWordID + i) }

// vocabSize is the tokenizer's vocabulary, specials included.
func vocabSize() int { return firstWordID + len(vocab) }

// tokenizerArchive is the zip GetTokenizer streams (tokenizer.json and
// tokenizer_config.json) and its hex SHA-256. Built once: it depends on
// nothing but the vocabulary.
var tokenizerArchive = sync.OnceValues(func() ([]byte, string) {
	words := map[string]int{"<unk>": tokUnk, "<s>": tokBOS, "</s>": tokEOS}
	for i, w := range vocab {
		words[w] = int(wordID(i))
	}
	special := func(id int, s string) map[string]any {
		return map[string]any{"id": id, "content": s, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true}
	}
	tok := map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   []any{special(tokUnk, "<unk>"), special(tokBOS, "<s>"), special(tokEOS, "</s>")},
		"normalizer":     nil,
		"pre_tokenizer":  map[string]any{"type": "WhitespaceSplit"},
		"post_processor": nil,
		"decoder":        nil,
		"model":          map[string]any{"type": "WordLevel", "vocab": words, "unk_token": "<unk>"},
	}
	cfg := map[string]any{
		"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
		"unk_token": "<unk>", "model_max_length": 1 << 20,
		"chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}" +
			"{% if add_generation_prompt %}assistant: {% endif %}",
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range []struct {
		name string
		v    any
	}{{"tokenizer.json", tok}, {"tokenizer_config.json", cfg}} {
		b, _ := json.MarshalIndent(f.v, "", " ")
		// A fixed time keeps the archive, and so its digest, the same on every start.
		w, _ := zw.CreateHeader(&zip.FileHeader{Name: f.name, Method: zip.Deflate, Modified: time.Unix(0, 0).UTC()})
		_, _ = w.Write(b)
	}
	_ = zw.Close()
	sum := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), hex.EncodeToString(sum[:])
})
