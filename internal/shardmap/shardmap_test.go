package shardmap

import (
	"fmt"
	"sync"
	"testing"
)

func TestLoadStoreDeleteRange(t *testing.T) {
	m := New[*int]()
	if _, ok := m.Load("a"); ok {
		t.Fatal("empty map loaded a value")
	}
	one, two := new(int), new(int)
	if v, loaded := m.LoadOrStore("a", one); loaded || v != one {
		t.Fatalf("first LoadOrStore = %p, %v; want the stored value, false", v, loaded)
	}
	if v, loaded := m.LoadOrStore("a", two); !loaded || v != one {
		t.Fatalf("second LoadOrStore = %p, %v; want the first value, true", v, loaded)
	}
	if m.CompareAndDelete("a", two) {
		t.Fatal("CompareAndDelete deleted a value that was not stored")
	}
	if !m.CompareAndDelete("a", one) {
		t.Fatal("CompareAndDelete kept the stored value")
	}
	if _, ok := m.Load("a"); ok {
		t.Fatal("deleted key still loads")
	}

	want := map[string]bool{}
	for i := range 1000 {
		k := fmt.Sprint("w", i)
		want[k] = true
		m.LoadOrStore(k, new(int))
	}
	seen := map[string]bool{}
	m.Range(func(k string, _ *int) bool {
		if seen[k] {
			t.Errorf("Range saw %q twice", k)
		}
		seen[k] = true
		return true
	})
	if len(seen) != len(want) {
		t.Fatalf("Range saw %d keys, want %d", len(seen), len(want))
	}
	n := 0
	m.Range(func(string, *int) bool { n++; return n < 10 })
	if n != 10 {
		t.Fatalf("Range went on after f returned false: %d calls, want 10", n)
	}
}

// Concurrent LoadOrStores of one key agree on a single value.
func TestLoadOrStoreOneWinner(t *testing.T) {
	m := New[*int]()
	const n = 32
	got := make([]*int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], _ = m.LoadOrStore("k", new(int)) })
	}
	wg.Wait()
	for i := range got {
		if got[i] != got[0] {
			t.Fatalf("goroutine %d got another value than goroutine 0", i)
		}
	}
}

// Range's f may change the map (a flush drops idle cells as it ranges over
// them): it holds no shard's lock while f runs.
func TestRangeMayChangeTheMap(t *testing.T) {
	m := New[*int]()
	for i := range 500 {
		m.LoadOrStore(fmt.Sprint("w", i), new(int))
	}
	m.Range(func(k string, v *int) bool {
		if !m.CompareAndDelete(k, v) {
			t.Errorf("CompareAndDelete(%q) inside Range kept it", k)
		}
		return true
	})
	for i := range 500 {
		if _, ok := m.Load(fmt.Sprint("w", i)); ok {
			t.Fatalf("w%d still loads after Range deleted it", i)
		}
	}
}
