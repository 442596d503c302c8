// Package tokenizer turns text into token ids and ids back into text with a
// Hugging Face tokenizer.json: byte-level BPE (as Llama 3, Qwen 2/3 and GPT-2
// use), added and special tokens, an NFC normalizer, and the pre-tokenizer
// split patterns those models ship. It reads files only from the caller; it
// knows nothing about engines, routing or chat templates.
package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Limits on what a tokenizer file may declare: a hostile or broken file is
// refused instead of exhausting memory.
const (
	maxVocab     = 1 << 21
	maxTokenLen  = 1 << 10
	maxFileBytes = 64 << 20
)

// Tokenizer is a loaded tokenizer.json. It is safe for concurrent use.
type Tokenizer struct {
	vocab   map[string]uint32 // byte-level string -> id
	tokens  []string          // id -> byte-level string ("" where unused)
	merges  map[uint64]merge  // pair of ids -> rank and result
	added   []addedToken      // longest first
	addedBy map[uint32]*addedToken
	// addedFirst lists, by first byte, the indexes into added of the tokens
	// starting with it: most bytes of a text start none.
	addedFirst [256][]int32
	nfc        bool
	split      splitter
	// ignoreMerges: a pre-token found whole in the vocabulary is one token
	// (Llama 3), without running the merges.
	ignoreMerges bool
	cleanup      bool // decode: clean_up_tokenization_spaces

	cacheMu sync.RWMutex
	cache   map[string][]uint32
}

type merge struct {
	rank   int32
	result uint32
}

type addedToken struct {
	id      uint32
	content string
	special bool
	lstrip  bool
	rstrip  bool
}

// Options of Load.
type Options struct {
	// Config is the model's tokenizer_config.json, when there is one: its
	// clean_up_tokenization_spaces is read from it.
	Config io.Reader
}

// file is the part of tokenizer.json this package reads.
type file struct {
	AddedTokens []struct {
		ID         uint32 `json:"id"`
		Content    string `json:"content"`
		Special    bool   `json:"special"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		SingleWord bool   `json:"single_word"`
	} `json:"added_tokens"`
	Normalizer   *component      `json:"normalizer"`
	PreTokenizer *component      `json:"pre_tokenizer"`
	Decoder      *component      `json:"decoder"`
	Model        json.RawMessage `json:"model"`
}

type component struct {
	Type          string      `json:"type"`
	Normalizers   []component `json:"normalizers"`
	Pretokenizers []component `json:"pretokenizers"`
	Decoders      []component `json:"decoders"`
	Pattern       struct {
		Regex  string `json:"Regex"`
		String string `json:"String"`
	} `json:"pattern"`
	Behavior       string `json:"behavior"`
	Invert         bool   `json:"invert"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	UseRegex       bool   `json:"use_regex"`
}

type bpeModel struct {
	Type         string            `json:"type"`
	Vocab        map[string]uint32 `json:"vocab"`
	Merges       json.RawMessage   `json:"merges"`
	IgnoreMerges bool              `json:"ignore_merges"`
	ByteFallback bool              `json:"byte_fallback"`
	Prefix       *string           `json:"continuing_subword_prefix"`
	Suffix       *string           `json:"end_of_word_suffix"`
}

// Load reads a tokenizer.json. Anything it does not implement exactly is an
// error naming the component, never a tokenizer that silently differs.
func Load(r io.Reader, opts Options) (*Tokenizer, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if len(b) > maxFileBytes {
		return nil, fmt.Errorf("tokenizer.json: larger than %d MiB", maxFileBytes>>20)
	}
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	var m bpeModel
	if err := json.Unmarshal(f.Model, &m); err != nil {
		return nil, fmt.Errorf("tokenizer.json model: %w", err)
	}
	if m.Type != "BPE" {
		return nil, fmt.Errorf("tokenizer.json: model type %q is not supported (byte-level BPE only)", m.Type)
	}
	if m.ByteFallback || (m.Prefix != nil && *m.Prefix != "") || (m.Suffix != nil && *m.Suffix != "") {
		return nil, errors.New("tokenizer.json: BPE with byte_fallback or subword affixes is not supported (byte-level BPE only)")
	}
	if len(m.Vocab) == 0 || len(m.Vocab) > maxVocab {
		return nil, fmt.Errorf("tokenizer.json: vocabulary of %d tokens (want 1..%d)", len(m.Vocab), maxVocab)
	}
	t := &Tokenizer{vocab: m.Vocab, ignoreMerges: m.IgnoreMerges, addedBy: map[uint32]*addedToken{}, cache: map[string][]uint32{}}
	if err := t.setPipeline(&f); err != nil {
		return nil, err
	}
	if err := t.setTokens(&f); err != nil {
		return nil, err
	}
	if err := t.setMerges(m.Merges); err != nil {
		return nil, err
	}
	if opts.Config != nil {
		var cfg struct {
			Cleanup *bool `json:"clean_up_tokenization_spaces"`
		}
		if err := json.NewDecoder(io.LimitReader(opts.Config, maxFileBytes)).Decode(&cfg); err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: %w", err)
		}
		t.cleanup = cfg.Cleanup != nil && *cfg.Cleanup
	}
	return t, nil
}

// setPipeline reads the normalizer, pre-tokenizer and decoder: only the
// byte-level shapes this package implements are accepted.
func (t *Tokenizer) setPipeline(f *file) error {
	if n := f.Normalizer; n != nil {
		switch n.Type {
		case "NFC":
			t.nfc = true
		case "Sequence":
			if len(n.Normalizers) != 0 {
				return fmt.Errorf("tokenizer.json: normalizer sequence %v is not supported", n.Normalizers)
			}
		default:
			return fmt.Errorf("tokenizer.json: normalizer %q is not supported (none or NFC)", n.Type)
		}
	}
	if d := f.Decoder; d == nil || d.Type != "ByteLevel" {
		return errors.New("tokenizer.json: the decoder must be ByteLevel")
	}
	p := f.PreTokenizer
	if p == nil {
		return errors.New("tokenizer.json: no pre_tokenizer (a ByteLevel one is needed)")
	}
	var steps []component
	if p.Type == "Sequence" {
		steps = p.Pretokenizers
	} else {
		steps = []component{*p}
	}
	switch {
	case len(steps) == 1 && steps[0].Type == "ByteLevel" && steps[0].UseRegex && !steps[0].AddPrefixSpace:
		t.split = gpt2Split
	case len(steps) == 2 && steps[0].Type == "Split" && steps[1].Type == "ByteLevel" && !steps[1].UseRegex && !steps[1].AddPrefixSpace:
		s := steps[0]
		if s.Behavior != "Isolated" || s.Invert {
			return fmt.Errorf("tokenizer.json: Split behavior %q (invert %v) is not supported (Isolated only)", s.Behavior, s.Invert)
		}
		sp, ok := knownSplits[s.Pattern.Regex]
		if !ok {
			return fmt.Errorf("tokenizer.json: the Split pattern %q is not one this tokenizer implements", s.Pattern.Regex)
		}
		t.split = sp
	default:
		return errors.New("tokenizer.json: the pre_tokenizer must be ByteLevel with its regex, or Split then ByteLevel")
	}
	return nil
}

func (t *Tokenizer) setTokens(f *file) error {
	size := 0
	for s, id := range t.vocab {
		if len(s) > maxTokenLen || id >= maxVocab {
			return fmt.Errorf("tokenizer.json: vocabulary entry %q -> %d out of bounds", trim(s), id)
		}
		size = max(size, int(id)+1)
	}
	for _, a := range f.AddedTokens {
		if a.ID >= maxVocab || a.Content == "" || len(a.Content) > maxTokenLen {
			return fmt.Errorf("tokenizer.json: added token %q -> %d out of bounds", trim(a.Content), a.ID)
		}
		if a.SingleWord {
			return fmt.Errorf("tokenizer.json: added token %q is single_word, which is not supported", trim(a.Content))
		}
		size = max(size, int(a.ID)+1)
	}
	t.tokens = make([]string, size)
	for s, id := range t.vocab {
		t.tokens[id] = s
	}
	t.added = make([]addedToken, len(f.AddedTokens))
	for i, a := range f.AddedTokens {
		t.added[i] = addedToken{id: a.ID, content: a.Content, special: a.Special, lstrip: a.LStrip, rstrip: a.RStrip}
	}
	sort.SliceStable(t.added, func(i, j int) bool { return len(t.added[i].content) > len(t.added[j].content) })
	for i := range t.added {
		t.addedBy[t.added[i].id] = &t.added[i]
		first := t.added[i].content[0]
		t.addedFirst[first] = append(t.addedFirst[first], int32(i))
	}
	return nil
}

func (t *Tokenizer) setMerges(raw json.RawMessage) error {
	var pairs [][2]string
	var asStrings []string
	if err := json.Unmarshal(raw, &asStrings); err == nil {
		pairs = make([][2]string, len(asStrings))
		for i, s := range asStrings {
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return fmt.Errorf("tokenizer.json: merge %d %q is not two tokens", i, trim(s))
			}
			pairs[i] = [2]string{a, b}
		}
	} else if err := json.Unmarshal(raw, &pairs); err != nil {
		return fmt.Errorf("tokenizer.json: merges: %w", err)
	}
	t.merges = make(map[uint64]merge, len(pairs))
	for rank, p := range pairs {
		a, okA := t.vocab[p[0]]
		b, okB := t.vocab[p[1]]
		c, okC := t.vocab[p[0]+p[1]]
		if !okA || !okB || !okC {
			return fmt.Errorf("tokenizer.json: merge %d (%q %q) names a token missing from the vocabulary", rank, trim(p[0]), trim(p[1]))
		}
		key := uint64(a)<<32 | uint64(b)
		if _, dup := t.merges[key]; !dup {
			t.merges[key] = merge{rank: int32(rank), result: c}
		}
	}
	return nil
}

func trim(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// VocabSize is one more than the largest id, added tokens included.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// TokenID returns the id of a token (an added token's content, or a
// vocabulary entry in its byte-level spelling).
func (t *Tokenizer) TokenID(token string) (uint32, bool) {
	for i := range t.added {
		if t.added[i].content == token {
			return t.added[i].id, true
		}
	}
	id, ok := t.vocab[token]
	return id, ok
}

// Encode returns the ids of text, added tokens recognised where they occur;
// no special token is added around it (a chat template writes those).
func (t *Tokenizer) Encode(text string) []uint32 {
	ids := make([]uint32, 0, len(text)/3+1)
	t.splitAdded(text, func(segment string, added *addedToken) {
		if added != nil {
			ids = append(ids, added.id)
			return
		}
		if t.nfc {
			segment = norm.NFC.String(segment)
		}
		t.split(segment, func(piece string) {
			ids = t.appendPiece(ids, piece)
		})
	})
	return ids
}

// splitAdded cuts text at every added token (longest first where several
// start at one place), calling fn for each plain segment and each token.
func (t *Tokenizer) splitAdded(text string, fn func(segment string, added *addedToken)) {
	start := 0 // start of the pending plain segment
	for i := 0; i < len(text); {
		a := t.addedAt(text, i)
		if a == nil {
			i++
			continue
		}
		from, to := i, i+len(a.content)
		if a.lstrip {
			for from > start {
				r, n := utf8.DecodeLastRuneInString(text[start:from])
				if !isSpace(r) {
					break
				}
				from -= n
			}
		}
		if a.rstrip {
			for to < len(text) {
				r, n := utf8.DecodeRuneInString(text[to:])
				if !isSpace(r) {
					break
				}
				to += n
			}
		}
		if from > start {
			fn(text[start:from], nil)
		}
		fn("", a)
		start, i = to, to
	}
	if start < len(text) {
		fn(text[start:], nil)
	}
}

func (t *Tokenizer) addedAt(text string, i int) *addedToken {
	for _, k := range t.addedFirst[text[i]] {
		if strings.HasPrefix(text[i:], t.added[k].content) {
			return &t.added[k]
		}
	}
	return nil
}

// appendPiece appends the ids of one pre-token.
func (t *Tokenizer) appendPiece(ids []uint32, piece string) []uint32 {
	t.cacheMu.RLock()
	cached, ok := t.cache[piece]
	t.cacheMu.RUnlock()
	if ok {
		return append(ids, cached...)
	}
	word := toByteLevel(piece)
	var out []uint32
	if id, ok := t.vocab[word]; ok && t.ignoreMerges {
		out = []uint32{id}
	} else {
		out = t.bpe(word)
	}
	if len(piece) <= 64 {
		t.cacheMu.Lock()
		if len(t.cache) >= 1<<16 {
			clear(t.cache) // bounded: a hostile prompt cannot grow it
		}
		t.cache[piece] = out
		t.cacheMu.Unlock()
	}
	return append(ids, out...)
}

// bpe merges a byte-level word: each step merges the adjacent pair of
// lowest rank (the leftmost of equal ranks), as the reference does.
func (t *Tokenizer) bpe(word string) []uint32 {
	syms := make([]uint32, 0, len(word))
	for _, r := range word {
		syms = append(syms, t.vocab[string(r)]) // every byte-level char is in a byte-level vocabulary
	}
	for len(syms) > 1 {
		best, at := merge{rank: -1}, -1
		for i := 0; i+1 < len(syms); i++ {
			m, ok := t.merges[uint64(syms[i])<<32|uint64(syms[i+1])]
			if ok && (at < 0 || m.rank < best.rank) {
				best, at = m, i
			}
		}
		if at < 0 {
			break
		}
		syms[at] = best.result
		syms = append(syms[:at+1], syms[at+2:]...)
	}
	return syms
}

// ErrUnknownID is returned for an id the tokenizer does not have.
var ErrUnknownID = errors.New("unknown token id")

// Decode returns the text of ids, special tokens included unless
// skipSpecial, with clean_up_tokenization_spaces applied when the model's
// config asks for it. Bytes that are not UTF-8 become U+FFFD.
func (t *Tokenizer) Decode(ids []uint32, skipSpecial bool) (string, error) {
	var b []byte
	for _, id := range ids {
		var err error
		if b, err = t.appendToken(b, id, skipSpecial); err != nil {
			return "", err
		}
	}
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	if t.cleanup {
		s = cleanupSpaces(s)
	}
	return s, nil
}

// TokenBytes returns the bytes of one token as it stands in a text (a
// special token's content), which may be part of a UTF-8 character.
func (t *Tokenizer) TokenBytes(id uint32) ([]byte, error) { return t.appendToken(nil, id, false) }

// appendToken appends the bytes of one id.
func (t *Tokenizer) appendToken(b []byte, id uint32, skipSpecial bool) ([]byte, error) {
	if a := t.addedBy[id]; a != nil {
		if a.special && skipSpecial {
			return b, nil
		}
		if _, inVocab := t.vocab[a.content]; !inVocab || a.special {
			return append(b, a.content...), nil
		}
	}
	if int(id) >= len(t.tokens) || t.tokens[id] == "" {
		return b, fmt.Errorf("%w %d (vocabulary of %d)", ErrUnknownID, id, len(t.tokens))
	}
	return fromByteLevel(b, t.tokens[id]), nil
}

// cleanupSpaces is the reference's clean_up_tokenization: no space before
// punctuation and English contractions, replaced one after the other as the
// reference does.
func cleanupSpaces(s string) string {
	for _, r := range [...][2]string{{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
		{" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}} {
		s = strings.ReplaceAll(s, r[0], r[1])
	}
	return s
}
