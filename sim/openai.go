package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// genRequest holds the fields of a chat or text completion the model reads.
type genRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	BootstrapHost    string  `json:"bootstrap_host"`
	BootstrapPort    *int    `json:"bootstrap_port"`
	BootstrapRoom    *uint64 `json:"bootstrap_room"`
	DataParallelRank *int    `json:"data_parallel_rank"`
}

// estimateTokens approximates a tokenizer: about four characters per token.
func estimateTokens(text string) int { return max(1, (len(text)+3)/4) }

// promptTokens estimates the prompt of a chat (4 tokens of template per
// message plus 3 to prime the answer) or of a completion (string, strings,
// token ids or lists of token ids).
func (g *genRequest) promptTokens(chat bool) (int, error) {
	if chat {
		if len(g.Messages) == 0 {
			return 0, errors.New("messages must not be empty")
		}
		n := 3
		for _, m := range g.Messages {
			n += 4 + contentTokens(m.Content)
		}
		return n, nil
	}
	var s string
	if json.Unmarshal(g.Prompt, &s) == nil {
		return estimateTokens(s), nil
	}
	var ss []string
	if json.Unmarshal(g.Prompt, &ss) == nil && len(ss) > 0 {
		return estimateTokens(strings.Join(ss, "")), nil
	}
	var ids []int
	if json.Unmarshal(g.Prompt, &ids) == nil && len(ids) > 0 {
		return len(ids), nil
	}
	var idss [][]int
	if json.Unmarshal(g.Prompt, &idss) == nil && len(idss) > 0 {
		n := 0
		for _, ids := range idss {
			n += len(ids)
		}
		return max(n, 1), nil
	}
	return 0, errors.New("prompt must be a string, a list of strings or token ids")
}

// contentTokens reads a message content: a string or a list of text parts.
func contentTokens(raw json.RawMessage) int {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return estimateTokens(s)
	}
	var parts []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return estimateTokens(b.String())
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) { s.generate(w, r, true) }

func (s *Server) handleCompletion(w http.ResponseWriter, r *http.Request) { s.generate(w, r, false) }

// words the simulated model says.
var vocab = strings.Fields(`the of and to in is that it for on with as was at by be this from or
have an they which one you were her all she there would their we him been has when who will more no
if out so said what up its about into than them can only other new some could time these two may
then do first any my now such like our over man me even most made after also did many before must`)

func (s *Server) generate(w http.ResponseWriter, r *http.Request, chat bool) {
	var g genRequest
	if err := json.NewDecoder(r.Body).Decode(&g); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	if g.Model != "" && g.Model != s.opts.Model {
		writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", g.Model))
		return
	}
	prompt, err := g.promptTokens(chat)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	maxTokens := s.opts.DefaultMaxTokens
	if g.MaxCompletionTokens != nil {
		maxTokens = *g.MaxCompletionTokens
	}
	if g.MaxTokens != nil {
		maxTokens = *g.MaxTokens
	}
	if maxTokens < 1 {
		writeError(w, http.StatusBadRequest, "max_tokens must be at least 1")
		return
	}
	spec := submitSpec{promptTokens: prompt, maxTokens: maxTokens, dpRank: -1}
	if g.DataParallelRank != nil {
		spec.dpRank = *g.DataParallelRank
	}
	if s.opts.Role != RoleRegular {
		if g.BootstrapRoom == nil || (s.opts.Role == RoleDecode && (g.BootstrapHost == "" || g.BootstrapPort == nil)) {
			writeError(w, http.StatusBadRequest, s.opts.Role+" engine needs bootstrap_host, bootstrap_port and bootstrap_room")
			return
		}
		spec.pd = &pdInfo{host: g.BootstrapHost, room: *g.BootstrapRoom}
		if g.BootstrapPort != nil {
			spec.pd.port = *g.BootstrapPort
		}
		if s.opts.Role == RolePrefill {
			spec.maxTokens = 1 // a prefill engine only computes the first token
		}
	}
	e := s.eng.Load()
	if e == nil {
		writeError(w, http.StatusServiceUnavailable, errEngineStopped.Error())
		return
	}
	req, err := e.submit(r.Context(), spec)
	switch {
	case errors.Is(err, errTooLong), errors.Is(err, errRoomInUse):
		writeError(w, http.StatusBadRequest, err.Error())
		return
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	defer req.cancel() // a no-op once done; frees the request when the client left
	id := fmt.Sprintf("%s-%d-%d", map[bool]string{true: "chatcmpl", false: "cmpl"}[chat], s.index, e.ids.Add(1))
	out := &output{chat: chat, id: id, model: s.opts.Model, created: time.Now().Unix(),
		words: rand.New(rand.NewPCG(req.seed, 0)), prompt: prompt}
	if g.Stream {
		s.stream(w, r, req, out, g.StreamOptions != nil && g.StreamOptions.IncludeUsage)
		return
	}
	var text strings.Builder
	for {
		select {
		case <-req.notify:
		case <-r.Context().Done():
			return
		}
		if !req.done.Load() {
			continue
		}
		if req.err != nil {
			writeError(w, http.StatusInternalServerError, req.err.Error())
			return
		}
		n := int(req.generated.Load())
		for range n {
			text.WriteString(out.word())
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out.final(text.String(), req.finish, n))
		return
	}
}

// output writes one request's answer in the OpenAI format.
type output struct {
	chat    bool
	id      string
	model   string
	created int64
	words   *rand.Rand
	prompt  int
	prefix  []byte // every chunk up to its text
}

func (o *output) word() string { return vocab[o.words.IntN(len(vocab))] + " " }

func (o *output) object() string {
	if o.chat {
		return "chat.completion"
	}
	return "text_completion"
}

func (o *output) head() string {
	model, _ := json.Marshal(o.model)
	obj := o.object()
	if o.chat {
		obj += ".chunk"
	}
	return `{"id":"` + o.id + `","object":"` + obj + `","created":` + strconv.FormatInt(o.created, 10) + `,"model":` + string(model)
}

func (o *output) usage(completion int) string {
	return fmt.Sprintf(`"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, o.prompt, completion, o.prompt+completion)
}

func (o *output) final(text, finish string, completion int) []byte {
	t, _ := json.Marshal(text)
	head := strings.Replace(o.head(), `.chunk"`, `"`, 1)
	if o.chat {
		return []byte(head + `,"choices":[{"index":0,"message":{"role":"assistant","content":` + string(t) +
			`},"logprobs":null,"finish_reason":"` + finish + `"}],` + o.usage(completion) + "}")
	}
	return []byte(head + `,"choices":[{"index":0,"text":` + string(t) + `,"logprobs":null,"finish_reason":"` +
		finish + `"}],` + o.usage(completion) + "}")
}

// appendChunk appends one SSE event carrying text (finish "" means null).
func (o *output) appendChunk(b []byte, text, finish string) []byte {
	if o.prefix == nil {
		field := `"text":"`
		if o.chat {
			field = `"delta":{"content":"`
		}
		o.prefix = []byte("data: " + o.head() + `,"choices":[{"index":0,` + field)
	}
	b = append(b, o.prefix...)
	b = append(b, text...) // vocabulary words need no JSON escaping
	if o.chat {
		b = append(b, '"', '}')
	} else {
		b = append(b, '"')
	}
	b = append(b, `,"logprobs":null,"finish_reason":`...)
	if finish == "" {
		b = append(b, "null"...)
	} else {
		b = append(b, '"')
		b = append(b, finish...)
		b = append(b, '"')
	}
	return append(b, "}]}\n\n"...)
}

func (s *Server) stream(w http.ResponseWriter, r *http.Request, req *request, out *output, includeUsage bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	buf := make([]byte, 0, 4096)
	// Headers go at once; the body starts with the first output, as in vLLM
	// and SGLang: the role chunk comes with the first token, after prefill,
	// so nothing reaches the client while the request waits or prefills.
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	roleSent := !out.chat
	sent := 0
	for {
		done := req.done.Load()
		n := int(req.generated.Load())
		if !roleSent && (n > sent || done) {
			buf = append(buf, "data: "+out.head()+`,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
			roleSent = true
		}
		for ; sent < n; sent++ {
			buf = out.appendChunk(buf, out.word(), "")
		}
		if done {
			if req.err != nil {
				buf = append(buf, "data: "...)
				buf = append(buf, errorJSON(http.StatusInternalServerError, req.err.Error())...)
				buf = append(buf, "\n\n"...)
			} else {
				buf = out.appendChunk(buf, "", req.finish)
				if includeUsage {
					buf = append(buf, "data: "+out.head()+`,"choices":[],`+out.usage(n)+"}\n\n"...)
				}
			}
			buf = append(buf, "data: [DONE]\n\n"...)
		}
		if len(buf) > 0 {
			if _, err := w.Write(buf); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
			buf = buf[:0]
		}
		if done {
			return
		}
		select {
		case <-req.notify:
		case <-r.Context().Done():
			return
		}
	}
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	owner := "vllm"
	if s.opts.Flavor == FlavorSGLang {
		owner = "sglang"
	}
	writeJSON(w, map[string]any{"object": "list", "data": []map[string]any{{
		"id": s.opts.Model, "object": "model", "created": s.started.Unix(), "owned_by": owner,
		"root": s.opts.Model, "max_model_len": s.opts.KVCapacityTokens,
	}}})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
