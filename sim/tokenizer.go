package sim

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"
	"time"

	"github.com/smg-project/smg/internal/chattemplate"
	"github.com/smg-project/smg/internal/tokenizer"
)

// The simulated model's tokenizer: a byte-level BPE Hugging Face tokenizer
// (as Llama 3 and Qwen ship) whose generated tokens are the vocabulary's
// words each with its trailing space, so that token ids streamed over gRPC
// decode to exactly the text the HTTP surface writes. Its byte alphabet and
// the merges that spell each word let any prompt be tokenized.
const (
	tokUnk      = 0
	tokBOS      = 1
	tokEOS      = 2
	firstWordID = 3
)

// wordID is the token id of vocab[i] followed by a space.
func wordID(i int) uint32 { return uint32(firstWordID + i) }

// vocabSize is the tokenizer's vocabulary, specials included.
func vocabSize() int { return len(tokenizerVocab().vocab) }

// simVocab is the tokenizer's vocabulary and merges.
type simVocab struct {
	vocab  map[string]int
	merges []string
}

// tokenizerVocab: the specials, the generated words, the 256 byte-level
// characters, then each word's prefixes (after a space and bare) with the
// merges that build them.
var tokenizerVocab = sync.OnceValue(func() simVocab {
	v := simVocab{vocab: map[string]int{"<unk>": tokUnk, "<s>": tokBOS, "</s>": tokEOS}}
	add := func(tok string) {
		if _, ok := v.vocab[tok]; !ok {
			v.vocab[tok] = len(v.vocab)
		}
	}
	for _, w := range vocab {
		add(tokenizer.ByteLevel(w + " "))
	}
	for b := range 256 {
		add(tokenizer.ByteLevel(string([]byte{byte(b)})))
	}
	seen := map[string]bool{}
	// Words after a space first: their merges rank lowest, so " the" is
	// one token rather than a space and "the".
	for _, lead := range []string{" ", ""} {
		for _, w := range vocab {
			runes := []rune(tokenizer.ByteLevel(lead + w))
			for n := 2; n <= len(runes); n++ {
				left, right := string(runes[:n-1]), string(runes[n-1])
				if m := left + " " + right; !seen[m] {
					seen[m] = true
					v.merges = append(v.merges, m)
					add(left + right)
				}
			}
		}
	}
	return v
})

// chatTemplate is the simulated model's chat template.
const chatTemplate = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}" +
	"{% if add_generation_prompt %}assistant: {% endif %}"

// tokenizerFiles are tokenizer.json and tokenizer_config.json.
func tokenizerFiles() (tok, cfg []byte) {
	v := tokenizerVocab()
	special := func(id int, s string) map[string]any {
		return map[string]any{"id": id, "content": s, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true}
	}
	tok, _ = json.MarshalIndent(map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   []any{special(tokUnk, "<unk>"), special(tokBOS, "<s>"), special(tokEOS, "</s>")},
		"normalizer":     nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"post_processor": nil,
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "vocab": v.vocab, "merges": v.merges},
	}, "", " ")
	cfg, _ = json.MarshalIndent(map[string]any{
		"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
		"unk_token": "<unk>", "model_max_length": 1 << 20, "clean_up_tokenization_spaces": false,
		"chat_template": chatTemplate,
	}, "", " ")
	return tok, cfg
}

var tokenizerArchive = sync.OnceValues(func() ([]byte, string) {
	tok, cfg := tokenizerFiles()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range []struct {
		name string
		b    []byte
	}{{"tokenizer.json", tok}, {"tokenizer_config.json", cfg}} {
		// A fixed time keeps the archive, and so its digest, the same on every start.
		w, _ := zw.CreateHeader(&zip.FileHeader{Name: f.name, Method: zip.Deflate, Modified: time.Unix(0, 0).UTC()})
		_, _ = w.Write(f.b)
	}
	_ = zw.Close()
	sum := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), hex.EncodeToString(sum[:])
})

// simModel is the simulated model's tokenizer and chat template, as a
// router loads them from the archive.
var simModel = sync.OnceValues(func() (*tokenizer.Tokenizer, *chattemplate.Template) {
	tj, cfg := tokenizerFiles()
	tok, err := tokenizer.Load(bytes.NewReader(tj), tokenizer.Options{Config: bytes.NewReader(cfg)})
	if err != nil {
		panic("sim: the simulated tokenizer does not load: " + err.Error())
	}
	tmpl, err := chattemplate.Load(bytes.NewReader(cfg))
	if err != nil {
		panic("sim: the simulated chat template does not load: " + err.Error())
	}
	return tok, tmpl
})

// usagePrompt is the prompt tokens an answer's usage reports: the model's
// tokenizer count of the prompt (a chat rendered with its template), which
// is what a gRPC worker reports for the router's token ids of the same
// request. The engine's work stays on the estimate (whole): four characters
// a token, which loads and tests are calibrated on. A chat the template
// cannot render reports the estimate.
func (g *genRequest) usagePrompt(chat bool, whole int) int {
	tok, tmpl := simModel()
	if chat {
		msgs := make([]chattemplate.Message, len(g.Messages))
		for i, m := range g.Messages {
			msgs[i] = chattemplate.Message{Role: m.Role, Content: m.Content}
		}
		text, err := tmpl.Render(msgs, chattemplate.Options{AddGenerationPrompt: true})
		if err != nil {
			return whole
		}
		return len(tok.Encode(text))
	}
	var s string
	if json.Unmarshal(g.Prompt, &s) == nil {
		return len(tok.Encode(s))
	}
	var ss []string
	if json.Unmarshal(g.Prompt, &ss) == nil {
		n := 0
		for _, p := range ss {
			n += len(tok.Encode(p))
		}
		return n
	}
	return whole // token ids: counted as they are
}
