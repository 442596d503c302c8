package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// genRequest holds the fields of a chat or text completion the model reads.
type genRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	// SGLang's bootstrap fields: scalars, or lists with one entry per
	// prompt of a batch.
	BootstrapHost    json.RawMessage `json:"bootstrap_host"`
	BootstrapPort    json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom    json.RawMessage `json:"bootstrap_room"`
	DataParallelRank *int            `json:"data_parallel_rank"`
	// Logprobs is a chat's boolean or a completion's number of
	// alternatives; TopLogprobs a chat's.
	Logprobs    json.RawMessage `json:"logprobs"`
	TopLogprobs *int            `json:"top_logprobs"`
}

// promptBatch is the prompt tokens of each prompt of a completion's batch (a
// list of strings or of token id lists), or whole for one prompt.
func (g *genRequest) promptBatch(chat bool, whole int) []int {
	if !chat {
		var ss []string
		if json.Unmarshal(g.Prompt, &ss) == nil && len(ss) > 1 {
			out := make([]int, len(ss))
			for i, p := range ss {
				out[i] = estimateTokens(p)
			}
			return out
		}
		var idss [][]int
		if json.Unmarshal(g.Prompt, &idss) == nil && len(idss) > 1 {
			out := make([]int, len(idss))
			for i, ids := range idss {
				out[i] = max(len(ids), 1)
			}
			return out
		}
	}
	return []int{whole}
}

// bootstraps reads the bootstrap fields as SGLang does: scalars for one
// request, or lists naming each prompt's prefill and room in a batch (a
// scalar host or port beside a list of rooms applies to every prompt). It
// returns nil without a room.
func (g *genRequest) bootstraps(prompts int) ([]pdInfo, error) {
	rooms, roomList, err := scalarOrList[uint64](g.BootstrapRoom)
	if err != nil {
		return nil, fmt.Errorf("bootstrap_room: %v", err)
	}
	hosts, hostList, err := scalarOrList[string](g.BootstrapHost)
	if err != nil {
		return nil, fmt.Errorf("bootstrap_host: %v", err)
	}
	ports, portList, err := scalarOrList[*int](g.BootstrapPort)
	if err != nil {
		return nil, fmt.Errorf("bootstrap_port: %v", err)
	}
	if len(rooms) == 0 {
		return nil, nil
	}
	n := len(rooms)
	switch {
	case roomList && n != prompts:
		return nil, fmt.Errorf("bootstrap_room has %d entries for %d prompts", n, prompts)
	case hostList && len(hosts) != n, portList && len(ports) != n:
		return nil, fmt.Errorf("bootstrap_host, bootstrap_port and bootstrap_room must have one entry per prompt (%d)", n)
	}
	out := make([]pdInfo, n)
	for i := range out {
		out[i].room = rooms[i]
		if len(hosts) > 0 {
			out[i].host = hosts[min(i, len(hosts)-1)]
		}
		if len(ports) > 0 && ports[min(i, len(ports)-1)] != nil {
			out[i].port, out[i].hasPort = *ports[min(i, len(ports)-1)], true
		}
	}
	return out, nil
}

// scalarOrList decodes raw as one T or a list of T; absent or null is none.
func scalarOrList[T any](raw json.RawMessage) (vals []T, list bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, false, nil
	}
	if raw[0] == '[' {
		err = json.Unmarshal(raw, &vals)
		if err == nil && len(vals) == 0 {
			err = errors.New("empty list")
		}
		return vals, true, err
	}
	var v T
	err = json.Unmarshal(raw, &v)
	return []T{v}, false, err
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
	whole, err := g.promptTokens(chat)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ask, err := readLogprobs(chat, g.Logprobs, g.TopLogprobs)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	prompts := g.promptBatch(chat, whole)
	usage := whole // the answer carries no usage: no tokenizing
	if !g.Stream || (g.StreamOptions != nil && g.StreamOptions.IncludeUsage) {
		usage = g.usagePrompt(chat, whole)
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
	spec := submitSpec{maxTokens: maxTokens, dpRank: -1, stream: g.Stream && s.opts.Role != RolePrefill}
	if g.DataParallelRank != nil {
		spec.dpRank = *g.DataParallelRank
	}
	// One engine request per prompt when the bootstrap fields are lists (a
	// batched PD request, as SGLang splits it); otherwise one for the whole.
	specs := []submitSpec{spec}
	if s.opts.Role != RoleRegular {
		pds, err := g.bootstraps(len(prompts))
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		if len(pds) == 0 || (s.opts.Role == RoleDecode && slices.ContainsFunc(pds, func(p pdInfo) bool { return p.host == "" || !p.hasPort })) {
			writeError(w, http.StatusBadRequest, s.opts.Role+" engine needs bootstrap_host, bootstrap_port and bootstrap_room")
			return
		}
		if s.opts.Role == RolePrefill {
			spec.maxTokens = 1 // a prefill engine only computes the first token
		}
		if len(pds) == 1 {
			prompts = []int{whole}
		}
		specs = make([]submitSpec, len(pds))
		for i := range pds {
			specs[i] = spec
			specs[i].pd = &pds[i]
		}
	} else {
		prompts = []int{whole}
	}
	e := s.eng.Load()
	if e == nil {
		writeError(w, http.StatusServiceUnavailable, errEngineStopped.Error())
		return
	}
	reqs := make([]*request, len(specs))
	for i := range specs {
		specs[i].promptTokens = prompts[i]
		req, err := e.submit(r.Context(), specs[i])
		if err != nil {
			for _, q := range reqs[:i] {
				q.cancel()
			}
			if errors.Is(err, errTooLong) || errors.Is(err, errRoomInUse) {
				writeError(w, http.StatusBadRequest, err.Error())
			} else {
				writeError(w, http.StatusServiceUnavailable, err.Error())
			}
			return
		}
		defer req.cancel() // a no-op once done; frees the request when the client left
		reqs[i] = req
	}
	id := fmt.Sprintf("%s-%d-%d", map[bool]string{true: "chatcmpl", false: "cmpl"}[chat], s.index, e.ids.Add(1))
	outs := make([]*output, len(reqs))
	for i, req := range reqs {
		outs[i] = &output{chat: chat, id: id, model: s.opts.Model, created: time.Now().Unix(),
			words: rand.New(rand.NewPCG(req.seed, 0)), prompt: usage, index: i, ask: ask}
	}
	if g.Stream {
		s.stream(w, r, reqs, outs, g.StreamOptions != nil && g.StreamOptions.IncludeUsage)
		return
	}
	choices := make([]choice, len(reqs))
	completion := 0
	for i, req := range reqs {
		for !req.done.Load() {
			select {
			case <-req.notify:
			case <-r.Context().Done():
				return
			}
		}
		if req.err != nil {
			writeError(w, http.StatusInternalServerError, req.err.Error())
			return
		}
		n := int(req.generated.Load())
		var text strings.Builder
		words := make([]int, n)
		for k := range n {
			words[k] = outs[i].next()
			text.WriteString(vocab[words[k]] + " ")
		}
		choices[i] = choice{text: text.String(), finish: req.finish, logprobs: outs[i].logprobs(words)}
		completion += n
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(outs[0].final(choices, completion))
}

// choice is one prompt's answer in a final (non-streamed) answer.
type choice struct {
	text, finish string
	logprobs     []byte // nil: null
}

// output writes one request's answer in the OpenAI format.
type output struct {
	chat    bool
	id      string
	model   string
	created int64
	words   *rand.Rand
	prompt  int    // of the whole request
	index   int    // the choice: the prompt's place in a batch
	prefix  []byte // every chunk up to its text
	ask     logprobsAsk
	pos     int // words said so far
	offset  int // their text's length
}

// next is the index in vocab of the next word said.
func (o *output) next() int { return o.words.IntN(len(vocab)) }

// orNull is raw JSON, or null when empty.
func orNull(raw []byte) []byte {
	if raw == nil {
		return []byte("null")
	}
	return raw
}

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

func (o *output) final(choices []choice, completion int) []byte {
	var b strings.Builder
	b.WriteString(strings.Replace(o.head(), `.chunk"`, `"`, 1))
	b.WriteString(`,"choices":[`)
	for i, c := range choices {
		t, _ := json.Marshal(c.text)
		if i > 0 {
			b.WriteByte(',')
		}
		if o.chat {
			fmt.Fprintf(&b, `{"index":%d,"message":{"role":"assistant","content":%s},"logprobs":%s,"finish_reason":"%s"}`, i, t, orNull(c.logprobs), c.finish)
		} else {
			fmt.Fprintf(&b, `{"index":%d,"text":%s,"logprobs":%s,"finish_reason":"%s"}`, i, t, orNull(c.logprobs), c.finish)
		}
	}
	b.WriteString(`],` + o.usage(completion) + "}")
	return []byte(b.String())
}

// appendChunk appends one SSE event carrying text and its logprobs (nil
// means null; finish "" means null).
func (o *output) appendChunk(b []byte, text string, logprobs []byte, finish string) []byte {
	if o.prefix == nil {
		field := `"text":"`
		if o.chat {
			field = `"delta":{"content":"`
		}
		o.prefix = []byte("data: " + o.head() + `,"choices":[{"index":` + strconv.Itoa(o.index) + `,` + field)
	}
	b = append(b, o.prefix...)
	b = append(b, text...) // vocabulary words need no JSON escaping
	if o.chat {
		b = append(b, '"', '}')
	} else {
		b = append(b, '"')
	}
	b = append(b, `,"logprobs":`...)
	b = append(b, orNull(logprobs)...)
	b = append(b, `,"finish_reason":`...)
	if finish == "" {
		b = append(b, "null"...)
	} else {
		b = append(b, '"')
		b = append(b, finish...)
		b = append(b, '"')
	}
	return append(b, "}]}\n\n"...)
}

// stream answers with SSE: each request's chunks in turn (a batch's choices
// one after another, each with its index), then usage and [DONE].
func (s *Server) stream(w http.ResponseWriter, r *http.Request, reqs []*request, outs []*output, includeUsage bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	buf := make([]byte, 0, 4096)
	// Headers go at once; the body starts with the first output, as in vLLM
	// and SGLang: the role chunk comes with the first token, after prefill,
	// so nothing reaches the client while the request waits or prefills.
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	completion := 0
	for i, req := range reqs {
		out, last := outs[i], i == len(reqs)-1
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
				w := out.next()
				buf = out.appendChunk(buf, vocab[w]+" ", out.logprobs([]int{w}), "")
			}
			failed := done && req.err != nil
			if failed {
				buf = append(buf, "data: "...)
				buf = append(buf, errorJSON(http.StatusInternalServerError, req.err.Error())...)
				buf = append(buf, "\n\n"...)
			} else if done {
				completion += n
				buf = out.appendChunk(buf, "", nil, req.finish)
				if last && includeUsage {
					buf = append(buf, "data: "+out.head()+`,"choices":[],`+out.usage(completion)+"}\n\n"...)
				}
			}
			if failed || (done && last) {
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
			if failed {
				return
			}
			if done {
				break
			}
			select {
			case <-req.notify:
			case <-r.Context().Done():
				return
			}
		}
	}
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	owner := "vllm"
	if s.opts.Flavor == FlavorSGLang {
		owner = "sglang"
	}
	writeJSON(w, map[string]any{"object": "list", "data": []map[string]any{{
		"id": s.opts.Model, "object": "model", "created": s.startedAt().Unix(), "owned_by": owner,
		"root": s.opts.Model, "max_model_len": s.opts.KVCapacityTokens,
	}}})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
