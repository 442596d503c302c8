// Package bench is smg bench: an open-loop load generator for
// OpenAI-compatible streaming endpoints and the summary of what it measured.
// It is linked into smg, so it holds nothing else: the scenarios that start
// fleets of processes are package bench/suite.
//
// It drives smg from outside, through its public APIs only; it imports no
// component's internals.
package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Dist is a distribution of token counts: a fixed value ("48"), a uniform
// range ("32-64", both ends included) or a log-uniform one ("64~16384":
// each doubling of length as likely as the next, as real prompt lengths
// spread over orders of magnitude).
type Dist struct {
	Min, Max int
	Log      bool
}

// ParseDist reads "N", "MIN-MAX" or "MIN~MAX".
func ParseDist(s string) (Dist, error) {
	sep := "-"
	if strings.Contains(s, "~") {
		sep = "~"
	}
	lo, hi, isRange := strings.Cut(strings.TrimSpace(s), sep)
	a, err := strconv.Atoi(lo)
	if err != nil {
		return Dist{}, fmt.Errorf("%q: want N, MIN-MAX or MIN~MAX", s)
	}
	b := a
	if isRange {
		if b, err = strconv.Atoi(hi); err != nil {
			return Dist{}, fmt.Errorf("%q: want N, MIN-MAX or MIN~MAX", s)
		}
	}
	if a < 1 || b < a {
		return Dist{}, fmt.Errorf("%q: want 1 <= MIN <= MAX", s)
	}
	return Dist{a, b, sep == "~" && a < b}, nil
}

// String formats d the way ParseDist reads it.
func (d Dist) String() string {
	switch {
	case d.Min == d.Max:
		return strconv.Itoa(d.Min)
	case d.Log:
		return fmt.Sprintf("%d~%d", d.Min, d.Max)
	}
	return fmt.Sprintf("%d-%d", d.Min, d.Max)
}

// Set lets a Dist be a flag.Value.
func (d *Dist) Set(s string) error {
	v, err := ParseDist(s)
	if err == nil {
		*d = v
	}
	return err
}

// Sample draws one value.
func (d Dist) Sample(r *rand.Rand) int {
	if d.Max <= d.Min {
		return d.Min
	}
	if d.Log {
		lo, hi := math.Log(float64(d.Min)), math.Log(float64(d.Max)+1)
		return min(d.Max, int(math.Exp(lo+r.Float64()*(hi-lo))))
	}
	return d.Min + r.IntN(d.Max-d.Min+1)
}

// Mean is the expected value.
func (d Dist) Mean() float64 {
	if d.Log && d.Max > d.Min {
		// The continuous log-uniform on [Min, Max+1), floored.
		lo, hi := float64(d.Min), float64(d.Max)+1
		return (hi-lo)/math.Log(hi/lo) - 0.5
	}
	return float64(d.Min+d.Max) / 2
}

// promptWords are the words prompts are made of; each is 4 characters with its
// space, so a prompt of n words reads as about n tokens to a 4-chars-per-token
// estimate (the simulator's and the router's), and each is a word of the
// simulated model, so its tokenizer (which a router serving the engines over
// gRPC runs) reads one token per word too.
var promptWords = strings.Fields("the and for was you her all she him has who out its can new two may any now our man did one")

// makePrompt returns text of about tokens tokens. Prompts start with different
// words so that prefix-affinity policies see unrelated requests, as they would
// from independent users.
func makePrompt(r *rand.Rand, tokens int) string {
	var b strings.Builder
	b.Grow(tokens * 4)
	for range tokens {
		b.WriteString(promptWords[r.IntN(len(promptWords))])
		b.WriteByte(' ')
	}
	return b.String()
}
