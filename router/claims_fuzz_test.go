package router

import "testing"

// A request body is a client's: whatever it says, the rooms and tokens it
// claims stay in range (at least one room and at most maxRooms, tokens in
// [prompt+output, maxRequestTokens]), so no n or max_tokens wraps a claim
// around to one the windows and token budgets do not count.
func FuzzRequestClaims(f *testing.F) {
	for _, s := range fieldsSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"prompt":["a","b","c","d"],"n":4611686018427387904}`))
	f.Add([]byte(`{"prompt":"x","n":9223372036854775807,"max_tokens":1073741824}`))
	f.Add([]byte(`{"messages":[],"n":-5,"max_completion_tokens":-1,"sampling_params":{"max_new_tokens":99999999999}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var fl requestFields
		if parseFields(body, &fl) != nil {
			return
		}
		rooms, prompts := batchSize(&fl)
		if rooms < 1 || rooms > maxRooms || prompts < 0 || rooms < min(prompts, maxRooms) {
			t.Fatalf("%q: %d rooms for %d prompts", body, rooms, prompts)
		}
		out := expectedOutput(&fl, DefaultOutputTokens)
		if out < 0 || out > maxRequestTokens {
			t.Fatalf("%q: expected output %d", body, out)
		}
		prompt := int64(len(fl.prompt()) / 4)
		if tokens := requestTokens(prompt, out, rooms); tokens < min(prompt+out, maxRequestTokens) || tokens > maxRequestTokens {
			t.Fatalf("%q: %d tokens claimed for a prompt of %d, output %d, %d rooms", body, tokens, prompt, out, rooms)
		}
	})
}
