package tokenizer

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// benchText is the input of the throughput figures, the same file the JS
// reference is timed on (testdata/bench.mjs).
func benchText(b *testing.B) string {
	t, err := os.ReadFile(filepath.Join("testdata", "bench.txt"))
	if err != nil {
		b.Fatal(err)
	}
	return string(t)
}

// cpuTime is this process's user and system CPU time so far: on a shared
// machine, tokens per CPU second is the figure that compares across runs.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEncode reports tokens per CPU second for each model, with the
// piece cache warm (as the reference keeps its own) and cold (every round a
// new prompt).
func BenchmarkEncode(b *testing.B) {
	for _, name := range models {
		tok := loadModel(b, name)
		text := benchText(b)
		for _, cold := range []bool{false, true} {
			label := name + "/warm"
			if cold {
				label = name + "/cold"
			}
			b.Run(label, func(b *testing.B) {
				n := 0
				b.SetBytes(int64(len(text)))
				cpu := cpuTime()
				for b.Loop() {
					if cold {
						clear(tok.cache)
					}
					n += len(tok.Encode(text))
				}
				b.ReportMetric(float64(n)/(cpuTime()-cpu).Seconds(), "tokens/cpu-s")
			})
		}
	}
}

func BenchmarkStreamDecode(b *testing.B) {
	tok := loadModel(b, "qwen3")
	ids := tok.Encode(benchText(b))
	cpu := cpuTime()
	for b.Loop() {
		d := tok.NewStreamDecoder(true)
		for _, id := range ids {
			_, _ = d.Next(id)
		}
	}
	b.ReportMetric(float64(len(ids)*b.N)/(cpuTime()-cpu).Seconds(), "tokens/cpu-s")
}
