package engine

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// maxBody bounds any answer read from an engine; a /metrics page of a large
// DP deployment is a few hundred KiB.
const maxBody = 16 << 20

// maxLines bounds the lines of a /metrics page parsed: parsing holds about
// 100 bytes per sample whatever its length, so a page of short lines would
// cost many times its size (a large DP deployment's page has a few
// thousand lines).
const maxLines = 100_000

// ParseError is a payload that could not be decoded. It is never a transport
// failure: the engine answered, wrongly.
type ParseError struct {
	Wire string
	Err  error
}

func (e *ParseError) Error() string { return e.Wire + ": " + e.Err.Error() }
func (e *ParseError) Unwrap() error { return e.Err }

// noReportError says why an answer carried no load; it matches ErrNoReport
// and wraps the errors met on the way (an HTTP status, a parse error).
type noReportError struct {
	why    string
	causes []error
}

func (e *noReportError) Error() string        { return ErrNoReport.Error() + ": " + e.why }
func (e *noReportError) Is(target error) bool { return target == ErrNoReport }
func (e *noReportError) Unwrap() []error      { return e.causes }

// noReport builds an ErrNoReport error naming why a payload carried no load.
func noReport(format string, args ...any) error {
	return &noReportError{why: fmt.Sprintf(format, args...)}
}

// families is one parsed Prometheus text page.
type families map[string]*dto.MetricFamily

// readFamilies reads and parses a Prometheus text page.
func readFamilies(r io.Reader) (families, error) {
	body, err := io.ReadAll(io.LimitReader(r, maxBody+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxBody {
		return nil, &ParseError{Wire: "prometheus text", Err: fmt.Errorf("page larger than %d bytes", maxBody)}
	}
	return parseFamilies(body)
}

// parseFamilies parses a Prometheus text page (format 0.0.4) with expfmt. The
// parser must come from NewTextParser: its zero value panics.
func parseFamilies(body []byte) (families, error) {
	if n := bytes.Count(body, []byte{'\n'}); n > maxLines {
		return nil, &ParseError{Wire: "prometheus text", Err: fmt.Errorf("page of %d lines, more than %d", n, maxLines)}
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	body = fixNegativeNaN(body)
	if n := len(body); n > 0 && body[n-1] != '\n' {
		// The text parser rejects a last line without its newline.
		body = append(body[:n:n], '\n')
	}
	fs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, &ParseError{Wire: "prometheus text", Err: err}
	}
	return fs, nil
}

// fixNegativeNaN rewrites a "-nan" sample value (what C++ streams print for a
// 0/0 gauge, as llama.cpp's busy-slots ratio once did) to "NaN", which the
// text parser accepts; otherwise one such line would void the whole page. The
// caller's bytes are never modified, and a page without one is not copied.
func fixNegativeNaN(body []byte) []byte {
	var out []byte
	last := 0
	for i := 1; i+4 <= len(body); i++ {
		if body[i] != '-' || (body[i-1] != ' ' && body[i-1] != '\t') || !strings.EqualFold(string(body[i+1:i+4]), "nan") {
			continue
		}
		if j := i + 4; j < len(body) && body[j] != '\n' && body[j] != '\r' && body[j] != ' ' && body[j] != '\t' {
			continue
		}
		out = append(append(out, body[last:i]...), "NaN"...)
		last = i + 4
	}
	if out == nil {
		return body
	}
	return append(out, body[last:]...)
}

// hasPrefix reports whether the page has any family whose name starts with p:
// how a wire is recognised before its load gauges are looked at.
func (fs families) hasPrefix(p string) bool {
	for name := range fs {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// startTime is the page's process_start_time_seconds (what Prometheus
// client libraries export for the serving process), or 0 when the page has
// none or its value is not a finite positive number.
func (fs families) startTime() float64 {
	f := fs["process_start_time_seconds"]
	if f == nil || len(f.GetMetric()) == 0 {
		return 0
	}
	v := metricValue(f.GetMetric()[0], sampleValue)
	if !(v > 0) || math.IsInf(v, 1) {
		return 0
	}
	return v
}

// first returns the first of names present on the page, or "".
func (fs families) first(names ...string) string {
	for _, n := range names {
		if fs[n] != nil {
			return n
		}
	}
	return ""
}

// valueKind says which number of a sample to read.
type valueKind int

const (
	sampleValue valueKind = iota // gauge, counter or untyped value
	histCount                    // histogram (or summary) sample count
	histSum                      // histogram (or summary) sample sum
)

func metricValue(m *dto.Metric, k valueKind) float64 {
	switch k {
	case histCount:
		if h := m.GetHistogram(); h != nil {
			if c := h.GetSampleCountFloat(); c > 0 {
				return c
			}
			return float64(h.GetSampleCount())
		}
		if s := m.GetSummary(); s != nil {
			return float64(s.GetSampleCount())
		}
		return 0
	case histSum:
		if h := m.GetHistogram(); h != nil {
			return h.GetSampleSum()
		}
		if s := m.GetSummary(); s != nil {
			return s.GetSampleSum()
		}
		return 0
	}
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// filter selects series by one label value; the zero filter selects all.
type filter struct{ label, value string }

// rankValue is one DP rank's reading of a family.
type rankValue struct {
	rank int
	v    float64
}

// perRank reads one value per DP rank from family name. The rank is the first
// of rankLabels present on a series (0 when none is). Engines that repeat a
// rank's values on every TP rank label them tp_rank; the series with the
// lowest tp_rank wins, which is tp_rank="0" for plain TP and the first rank
// of each group under DP attention, where TP ranks are numbered globally.
// Series with a rank label that is not a small non-negative integer are
// skipped. Ranks come back in order of first appearance.
func (fs families) perRank(name string, rankLabels []string, f filter, k valueKind) []rankValue {
	mf := fs[name]
	if mf == nil {
		return nil
	}
	var out []rankValue
	var tps []int
next:
	for _, m := range mf.GetMetric() {
		rank, tp := 0, 0
		rankSet, matched := false, f.label == ""
		for _, lp := range m.GetLabel() {
			ln := lp.GetName()
			switch {
			case f.label != "" && ln == f.label:
				matched = lp.GetValue() == f.value
			case ln == "tp_rank":
				n, ok := smallInt(lp.GetValue())
				if !ok {
					continue next
				}
				tp = n
			case !rankSet && isRankLabel(ln, rankLabels):
				n, ok := smallInt(lp.GetValue())
				if !ok {
					continue next
				}
				rank, rankSet = n, true
			}
		}
		if !matched {
			continue
		}
		v := metricValue(m, k)
		for i := range out {
			if out[i].rank == rank {
				if tp < tps[i] {
					out[i].v, tps[i] = v, tp
				}
				continue next
			}
		}
		out = append(out, rankValue{rank: rank, v: v})
		tps = append(tps, tp)
		if len(out) > maxRanks {
			break // one past the bound is enough for rankSet to refuse the page
		}
	}
	return out
}

// sumRanks adds one family's per-rank readings.
func (fs families) sumRanks(name string, rankLabels []string, k valueKind) float64 {
	var s float64
	for _, rv := range fs.perRank(name, rankLabels, filter{}, k) {
		s += counter(rv.v)
	}
	return s
}

// sumAll adds every series of a family (for counters split by a label such as
// TGI's method="prefill"/"decode").
func (fs families) sumAll(name string, k valueKind) float64 {
	var s float64
	if mf := fs[name]; mf != nil {
		for _, m := range mf.GetMetric() {
			s += counter(metricValue(m, k))
		}
	}
	return s
}

// stepCounter reads a per-step histogram's sample count, also when the page
// has no TYPE line for it and the count is a family of its own.
func (fs families) stepCounter(name string, rankLabels []string) (float64, bool) {
	if fs[name] != nil {
		return fs.sumRanks(name, rankLabels, histCount), true
	}
	if fs[name+"_count"] != nil {
		return fs.sumRanks(name+"_count", rankLabels, sampleValue), true
	}
	return 0, false
}

func isRankLabel(name string, rankLabels []string) bool {
	for _, l := range rankLabels {
		if l == name {
			return true
		}
	}
	return false
}

// smallInt parses a rank number: a non-negative decimal integer below maxDPRank.
func smallInt(s string) (int, bool) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n >= maxDPRank {
		return 0, false
	}
	return n, true
}

// gaugeWire describes a Prometheus wire whose load is a set of per-rank gauges.
type gaugeWire struct {
	source     Source
	prefix     string   // family name prefix that identifies the wire
	rankLabels []string // labels carrying the DP rank
	waiting    string
	running    string
	usage      []string // KV usage gauge names, newest first
}

// ranks builds one Rank per DP rank that carries at least one load gauge.
func (w gaugeWire) ranks(fs families) *rankSet {
	var s rankSet
	for _, rv := range fs.perRank(w.waiting, w.rankLabels, filter{}, sampleValue) {
		s.get(rv.rank).Waiting = count(rv.v)
	}
	for _, rv := range fs.perRank(w.running, w.rankLabels, filter{}, sampleValue) {
		s.get(rv.rank).Running = count(rv.v)
	}
	if name := fs.first(w.usage...); name != "" {
		for _, rv := range fs.perRank(name, w.rankLabels, filter{}, sampleValue) {
			s.get(rv.rank).TokenUsage = fraction(rv.v)
		}
	}
	return &s
}

// annotate sets a field on ranks that already exist: series other than the
// load gauges never create a rank on their own.
func (fs families) annotate(s *rankSet, name string, rankLabels []string, k valueKind, set func(*Rank, float64)) {
	for _, rv := range fs.perRank(name, rankLabels, filter{}, k) {
		if r := s.find(rv.rank); r != nil {
			set(r, rv.v)
		}
	}
}

// hitCounters records cumulative prefix-cache hits and lookups and the
// lifetime hit rate they give; a Reader narrows it to the poll interval.
func (fs families) hitCounters(s *rankSet, hits, queries string, rankLabels []string) {
	if fs[hits] == nil || fs[queries] == nil {
		return
	}
	for _, rv := range fs.perRank(hits, rankLabels, filter{}, sampleValue) {
		if c := s.ctr(rv.rank); c != nil {
			c.hits = counter(rv.v)
		}
	}
	for _, rv := range fs.perRank(queries, rankLabels, filter{}, sampleValue) {
		c := s.ctr(rv.rank)
		if c == nil {
			continue
		}
		c.queries, c.hasHitRate = counter(rv.v), true
		if c.queries > 0 {
			s.find(rv.rank).CacheHitRate = fraction(c.hits / c.queries)
		}
	}
}

// genCounter records a cumulative generated-token counter for a wire that
// exports no throughput gauge.
func (fs families) genCounter(s *rankSet, name string, rankLabels []string, k valueKind) {
	for _, rv := range fs.perRank(name, rankLabels, filter{}, k) {
		if c := s.ctr(rv.rank); c != nil {
			c.genTokens, c.hasGen = counter(rv.v), true
		}
	}
}
