package testutil

import (
	"bytes"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Exposition is g's text exposition, what a Prometheus scraper reads, of
// the named families (none named: all): two collectors meant to expose the
// same series compare equal byte for byte.
func Exposition(g prometheus.Gatherer, names ...string) (string, error) {
	mfs, err := g.Gather()
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if len(names) > 0 && !slices.Contains(names, mf.GetName()) {
			continue
		}
		if err := enc.Encode(mf); err != nil {
			return "", err
		}
	}
	return b.String(), nil
}

// GatherWhile runs scrapers goroutines gathering g over and over, each
// result passed to check (nil: none), until during returns; it returns the
// first error a Gather or a check gave.
func GatherWhile(g prometheus.Gatherer, scrapers int, check func([]*dto.MetricFamily) error, during func()) error {
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	stop := make(chan struct{})
	for range scrapers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				mfs, err := g.Gather()
				if err == nil && check != nil {
					err = check(mfs)
				}
				if err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	during()
	close(stop)
	wg.Wait()
	return first
}
