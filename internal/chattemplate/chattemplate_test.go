package chattemplate

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func load(t *testing.T, model string) *Template {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", model+".json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tpl, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

type conversation struct {
	Messages            []Message      `json:"messages"`
	AddGenerationPrompt bool           `json:"add_generation_prompt"`
	Kwargs              map[string]any `json:"kwargs"`
}

// Byte for byte against the reference Jinja engine on the real templates of
// Qwen 3 and Llama 3 (testdata/gen.mjs made the expected prompts).
func TestRenderMatchesTheReference(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "conversations.json"))
	if err != nil {
		t.Fatal(err)
	}
	var convs []conversation
	if err := json.Unmarshal(b, &convs); err != nil {
		t.Fatal(err)
	}
	for _, model := range []string{"qwen3", "llama3"} {
		t.Run(model, func(t *testing.T) {
			tpl := load(t, model)
			b, err := os.ReadFile(filepath.Join("testdata", model+".expected.json"))
			if err != nil {
				t.Fatal(err)
			}
			var want []struct {
				Prompt string `json:"prompt"`
				Error  string `json:"error"`
			}
			if err := json.Unmarshal(b, &want); err != nil {
				t.Fatal(err)
			}
			if len(want) != len(convs) || len(convs) < 10 {
				t.Fatalf("%d expected prompts for %d conversations", len(want), len(convs))
			}
			for i, c := range convs {
				got, err := tpl.Render(c.Messages, Options{AddGenerationPrompt: c.AddGenerationPrompt, Kwargs: c.Kwargs})
				if want[i].Error != "" {
					if err == nil {
						t.Errorf("conversation %d rendered; the reference failed: %s", i, want[i].Error)
					}
					continue
				}
				if err != nil || got != want[i].Prompt {
					t.Errorf("conversation %d:\n got %q (%v)\nwant %q", i, got, err, want[i].Prompt)
				}
			}
		})
	}
}

func TestContentPartsAndBadInput(t *testing.T) {
	tpl := load(t, "qwen3")
	parts := json.RawMessage(`[{"type":"text","text":"one"},{"type":"text","text":"two"}]`)
	got, err := tpl.Render([]Message{{Role: "user", Content: parts}}, Options{AddGenerationPrompt: true})
	if err != nil || !strings.Contains(got, "one\ntwo") {
		t.Errorf("text parts: %q, %v", got, err)
	}
	for _, tc := range []struct {
		msgs []Message
		want string
	}{
		{nil, "no messages"},
		{[]Message{{Role: "user", Content: json.RawMessage(`"a"`)}, {Content: json.RawMessage(`"b"`)}}, "messages[1]: role is missing"},
		{[]Message{{Role: "user", Content: json.RawMessage(`[{"type":"image_url","image_url":{"url":"x"}}]`)}}, `messages[0]: content[0]: part of type "image_url"`},
		{[]Message{{Role: "user", Content: json.RawMessage(`42`)}}, "messages[0]: content must be a string"},
	} {
		_, err := tpl.Render(tc.msgs, Options{})
		var e *Error
		if !errors.As(err, &e) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Render(%v) = %v, want an *Error saying %q", tc.msgs, err, tc.want)
		}
	}
}

func TestLoadRefusesBrokenConfigs(t *testing.T) {
	for _, tc := range []struct{ config, want string }{
		{`{}`, "no chat_template"},
		{`{"chat_template": "{% for %}"}`, "does not compile"},
		{`{"chat_template": [{"name": "tool_use", "template": "x"}]}`, `no template named "default"`},
		{`{"chat_template": 3}`, "neither a string nor a list"},
		{`not json`, "tokenizer_config.json"},
	} {
		if _, err := Load(strings.NewReader(tc.config)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Load(%s) = %v, want an error saying %q", tc.config, err, tc.want)
		}
	}
	tpl, err := Load(strings.NewReader(`{"chat_template": [{"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"}], "bos_token": {"content": "<s>"}, "model_max_length": 4096}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := tpl.Render([]Message{{Role: "user", Content: json.RawMessage(`"hi"`)}}, Options{}); got != "<s>hi" {
		t.Errorf("named default template with an object bos_token: %q", got)
	}
	raising, err := Load(strings.NewReader(`{"chat_template": "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must start with user') }}{% endif %}ok"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raising.Render([]Message{{Role: "assistant", Content: json.RawMessage(`"x"`)}}, Options{}); err == nil ||
		!strings.Contains(err.Error(), "Conversation roles must start with user") {
		t.Errorf("a template's raise_exception: %v, want its message", err)
	}
	if tpl.MaxLength() != 4096 {
		t.Errorf("MaxLength = %d", tpl.MaxLength())
	}
}
