// Package chattemplate renders a model's chat template (the Jinja template
// of its tokenizer_config.json) into the prompt its engine expects, for
// workers that take token ids. It knows nothing about tokenizing, engines or
// HTTP.
package chattemplate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/ardanlabs/jinja"
)

const maxConfigBytes = 16 << 20

// Template is a model's compiled chat template with its special tokens.
type Template struct {
	tpl       *jinja.Template
	bosToken  string
	eosToken  string
	maxLength int // the model's context in tokens (model_max_length), 0 if unknown
}

// Message is one chat message as OpenAI's API sends it: content is a string
// or a list of parts, of which only text parts are taken.
type Message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name,omitempty"`
	// ReasoningContent is kept for templates that render an assistant's
	// reasoning (reasoning_content, as vLLM and SGLang name it).
	ReasoningContent string `json:"reasoning_content,omitempty"`
}

// Load reads tokenizer_config.json. A config without a chat template, or
// one that does not compile, is an error naming the problem.
func Load(r io.Reader) (*Template, error) {
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOS          json.RawMessage `json:"bos_token"`
		EOS          json.RawMessage `json:"eos_token"`
		MaxLength    float64         `json:"model_max_length"`
	}
	if err := json.NewDecoder(io.LimitReader(r, maxConfigBytes)).Decode(&cfg); err != nil {
		return nil, fmt.Errorf("tokenizer_config.json: %w", err)
	}
	source, err := pickTemplate(cfg.ChatTemplate)
	if err != nil {
		return nil, err
	}
	tpl, err := jinja.Compile(source)
	if err != nil {
		return nil, fmt.Errorf("tokenizer_config.json: the chat template does not compile: %w", err)
	}
	t := &Template{tpl: tpl, bosToken: tokenText(cfg.BOS), eosToken: tokenText(cfg.EOS)}
	if cfg.MaxLength > 0 && cfg.MaxLength < 1<<31 {
		t.maxLength = int(cfg.MaxLength)
	}
	return t, nil
}

// pickTemplate takes chat_template as a string, or the one named "default"
// of a list of named templates.
func pickTemplate(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", errors.New("tokenizer_config.json has no chat_template")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("tokenizer_config.json: chat_template is neither a string nor a list of named templates: %w", err)
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", errors.New("tokenizer_config.json: chat_template lists no template named \"default\"")
}

// tokenText reads a special token given as a string or as {"content": ...}.
func tokenText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var obj struct {
		Content string `json:"content"`
	}
	_ = json.Unmarshal(raw, &obj)
	return obj.Content
}

// MaxLength is the model's context length in tokens from its config, or 0.
func (t *Template) MaxLength() int { return t.maxLength }

// Options of Render.
type Options struct {
	AddGenerationPrompt bool
	// Kwargs are extra template variables (chat_template_kwargs, e.g.
	// enable_thinking); they cannot replace messages or the special tokens.
	Kwargs map[string]any
}

// Error is a request the template cannot render; Message is the index of
// the message at fault, or -1 when no one message is.
type Error struct {
	Message int
	Err     error
}

func (e *Error) Error() string {
	if e.Message >= 0 {
		return fmt.Sprintf("messages[%d]: %v", e.Message, e.Err)
	}
	return e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Render returns the prompt of messages.
func (t *Template) Render(messages []Message, opts Options) (string, error) {
	if len(messages) == 0 {
		return "", &Error{Message: -1, Err: errors.New("no messages")}
	}
	msgs := make([]any, len(messages))
	for i, m := range messages {
		if m.Role == "" {
			return "", &Error{Message: i, Err: errors.New("role is missing")}
		}
		content, err := textContent(m.Content)
		if err != nil {
			return "", &Error{Message: i, Err: err}
		}
		msg := map[string]any{"role": m.Role, "content": content}
		if m.Name != "" {
			msg["name"] = m.Name
		}
		if m.ReasoningContent != "" {
			msg["reasoning_content"] = m.ReasoningContent
		}
		msgs[i] = msg
	}
	data := make(map[string]any, len(opts.Kwargs)+4)
	for k, v := range opts.Kwargs {
		data[k] = v
	}
	data["messages"] = msgs
	data["add_generation_prompt"] = opts.AddGenerationPrompt
	data["bos_token"] = t.bosToken
	data["eos_token"] = t.eosToken
	out, err := t.tpl.Render(data)
	if err != nil {
		return "", &Error{Message: -1, Err: fmt.Errorf("the chat template failed: %w", err)}
	}
	return out, nil
}

// textContent reads a message's content: a string, null, or a list of parts
// whose text parts are joined by newlines (as vLLM does for text-only
// templates). Any other part is refused.
func textContent(raw json.RawMessage) (any, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, errors.New("content must be a string or a list of content parts")
	}
	texts := make([]string, 0, len(parts))
	for j, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return nil, fmt.Errorf("content[%d]: part of type %q is not supported (text only)", j, p.Type)
		}
		texts = append(texts, *p.Text)
	}
	return strings.Join(texts, "\n"), nil
}
