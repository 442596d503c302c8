package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/smg-project/smg/bench"
	"github.com/smg-project/smg/internal/cli"
)

const benchSummary = `Offer open-loop load to an OpenAI-compatible server: streaming chat completions
arriving as a Poisson process at --rate per second, so a slow server does not
slow the offered load. Prints progress every second and a summary at the end
(TTFT and inter-token latency of completed requests, sheds, 503 rate, errors,
goodput); --out writes every request's record as JSON.`

// runBench runs one load-generator pass against --url.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("bench", benchSummary, stderr)
	c := bench.Config{Prompt: bench.Dist{Min: 256, Max: 768}, Output: bench.Dist{Min: 32, Max: 64}}
	fs.StringVar(&c.URL, "url", "http://127.0.0.1:30000", "base URL of the server (the router, or an engine)")
	fs.StringVar(&c.Model, "model", "sim-model", "model field of every request")
	fs.Float64Var(&c.Rate, "rate", 10, "mean request arrivals per second (Poisson, open loop)")
	fs.IntVar(&c.Clients, "clients", 0, "closed loop instead: this many clients each sending its next request when the last ends (0: open loop at --rate)")
	fs.DurationVar(&c.Duration, "duration", 30*time.Second, "how long requests keep arriving; running ones are then awaited")
	fs.Var(&c.Prompt, "prompt-tokens", "prompt length in tokens: N, MIN-MAX drawn uniformly, or MIN~MAX drawn log-uniformly")
	fs.Var(&c.Output, "output-tokens", "max_tokens of each request: N, MIN-MAX drawn uniformly, or MIN~MAX drawn log-uniformly")
	fs.DurationVar(&c.Timeout, "timeout", 30*time.Second, "end-to-end bound on one request, retries included; a request past it counts as a timeout")
	fs.BoolVar(&c.HonorRetryAfter, "honor-retry-after", false, "on 503 or 429 with Retry-After, wait that long and try again (within --timeout)")
	fs.IntVar(&c.MaxRetries, "max-retries", 3, "with --honor-retry-after: tries after the first")
	fs.DurationVar(&c.TTFTObjective, "ttft-objective", time.Second, "goodput counts output tokens of requests whose time to first token is within this")
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of arrivals and of prompt and output lengths")
	fs.Var((*bench.PriorityMix)(&c.Priorities), "priority-mix",
		"send each arrival with x-smg-priority drawn from this mix: class=weight[:api-key],... (e.g. bulk=1:sk-batch,interactive=1:sk-chat); the summary then also reports each class")
	out := fs.String("out", "", "write the JSON result (config, per-request records, summary) to this file")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "smg bench: %s, %s, prompt %s tokens, output %s tokens\n", c.URL, load(c), c.Prompt, c.Output)
	res, err := bench.Run(ctx, bench.NewHTTPClient(), c, func(p bench.Progress) {
		fmt.Fprintf(stderr, "%5.0fs  sent %d  in flight %d  completed %d  shed %d  errors %d  tokens %d\n",
			p.Elapsed.Seconds(), p.Sent, p.InFlight, p.Completed, p.Shed, p.Errors, p.OutputTokens)
	})
	if err != nil && res == nil {
		return err
	}
	res.Summary.WriteTable(stdout, c.TTFTObjective)
	for _, p := range c.Priorities {
		if sm, ok := res.ByClass[p.Class]; ok {
			fmt.Fprintf(stdout, "\nclass %s:\n", p.Class)
			sm.WriteTable(stdout, c.TTFTObjective)
		}
	}
	if *out != "" {
		b, jerr := json.MarshalIndent(res, "", " ")
		if jerr != nil {
			return jerr
		}
		if werr := os.WriteFile(*out, b, 0o644); werr != nil {
			return werr
		}
	}
	if err == context.Canceled {
		return nil // interrupted: what ran is reported
	}
	return err
}

func load(c bench.Config) string {
	if c.Clients > 0 {
		return fmt.Sprintf("%d closed-loop clients for %s", c.Clients, c.Duration)
	}
	return fmt.Sprintf("%.1f req/s for %s", c.Rate, c.Duration)
}
