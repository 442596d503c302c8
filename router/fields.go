package router

import (
	"encoding/json"
	"strconv"
	"strings"
)

// parseFields fills f from a request body as json.Unmarshal would, with the
// same errors: json.Valid checks the whole body, then one walk over the top
// level picks out the few fields the router reads, skipping the rest (the
// prompt itself is only sliced). Anything the walk does not take as it comes
// (a key or string with escapes, a key matching a field only case-blind, a
// value of an unexpected type, a body that is not an object) goes to
// json.Unmarshal, so every answer, error text included, is Unmarshal's.
func parseFields(body []byte, f *requestFields) error {
	if json.Valid(body) && walkFields(body, f) {
		return nil
	}
	*f = requestFields{}
	return json.Unmarshal(body, f)
}

// walkFields reads the top-level fields of a valid JSON object into f; false
// when it cannot take the body as it comes.
func walkFields(b []byte, f *requestFields) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if b[i] == '}' {
		return true
	}
	for {
		end := stringEnd(b, i)
		if end < 0 {
			return false // escapes in the key
		}
		key := b[i+1 : end-1]
		i = skipSpace(b, end)
		i = skipSpace(b, i+1) // the colon
		vend := valueEnd(b, i)
		if !setField(f, key, b[i:vend]) {
			return false
		}
		i = skipSpace(b, vend)
		if b[i] == '}' {
			return true
		}
		i = skipSpace(b, i+1) // the comma
	}
}

// setField stores one top-level value; false when only Unmarshal can.
func setField(f *requestFields, key, v []byte) bool {
	null := string(v) == "null" // Unmarshal leaves a field as it is for null
	switch string(key) {
	case "model":
		if null {
			return true
		}
		if v[0] != '"' || stringEnd(v, 0) != len(v) || !ascii(v) {
			return false
		}
		f.Model = string(v[1 : len(v)-1])
	case "stream":
		switch string(v) {
		case "true":
			f.Stream = true
		case "false":
			f.Stream = false
		default:
			return null
		}
	case "n":
		if null {
			return true
		}
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return false // a fraction, an exponent, too large, not a number
		}
		f.N = n
	case "messages":
		f.Messages = v // null included: UnmarshalJSON gets it too
	case "prompt":
		f.Prompt = v
	case "input":
		f.Input = v
	case "text":
		f.Text = v
	case "input_ids":
		f.InputIDs = v
	case "max_tokens":
		f.MaxTokens = v
	case "max_completion_tokens":
		f.MaxCompletionTokens = v
	case "sampling_params":
		f.SamplingParams = v
	default:
		// Unmarshal matches keys case-blind too ("Model" sets Model).
		for _, name := range fieldNames {
			if strings.EqualFold(string(key), name) {
				return false
			}
		}
	}
	return true
}

var fieldNames = [...]string{"model", "stream", "n", "messages", "prompt", "input", "text", "input_ids",
	"max_tokens", "max_completion_tokens", "sampling_params"}

func ascii(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// stringEnd is the index just past the string starting at b[i] (a quote), or
// -1 when it holds an escape.
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			return -1
		case '"':
			return j + 1
		}
	}
	return -1
}

// valueEnd is the index just past the valid JSON value starting at b[i].
func valueEnd(b []byte, i int) int {
	depth := 0
	for j := i; j < len(b); j++ {
		switch c := b[j]; c {
		case '"':
			j++
			for b[j] != '"' {
				if b[j] == '\\' {
					j++
				}
				j++
			}
			if depth == 0 {
				return j + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return j // the end of the enclosing object
			}
			if depth--; depth == 0 {
				return j + 1
			}
		case ',', ' ', '\t', '\r', '\n':
			if depth == 0 {
				return j
			}
		}
	}
	return len(b)
}
