package admission

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// ClassConfig is one class's knobs (SMG's names in the YAML).
type ClassConfig struct {
	Reserved            int64         // slots held back from lower classes while unused
	QueueSize           int           // waiters beyond which the answer is 429
	QueueTimeout        time.Duration // longest wait before 408
	StarvationThreshold time.Duration // a head older than this is admitted next
	CanPreempt          bool          // may cancel a lower class that has sent no byte yet
	// ReserveDemand (smg's extension, off by default) makes the reservation
	// follow the class's observed demand: at least Reserved, and as many
	// slots as its arrivals keep busy (arrival rate × mean holding time,
	// plus a margin), so a lower class does not take the slots this class's
	// next arrivals need.
	ReserveDemand bool
	// TTFTObjective (smg's extension; 0: none) is the class's time to
	// first token objective (objective.go).
	TTFTObjective time.Duration
}

// SchedulerConfig is the scheduler's whole configuration: the classes, the tenants'
// ceilings, and how a caller's identity is found.
type SchedulerConfig struct {
	Classes         [NumClasses]ClassConfig
	DefaultMaxClass Class            // ceiling of a tenant without a policy
	TenantMaxClass  map[string]Class // tenant key ("auth:<name>", "header:<id>", ...) -> ceiling
	// APIKeys maps a caller's bearer token to a tenant name; the tenant key
	// is "auth:<name>".
	APIKeys map[string]string
	// TrustTenantHeader takes the tenant from TenantHeader ("header:<id>")
	// when no API key matched. Off unless the config says so: any client can
	// set a header.
	TrustTenantHeader bool
	TenantHeader      string
	// FairShare (smg's extension, off by default) orders each class's queue
	// by a virtual token counter per tenant and refuses with 429 a tenant
	// over its weighted fair share while another is active (vtc.go).
	FairShare bool
	// FairShareWait keeps a tenant over its fair share waiting (its turn
	// still comes by its counter) instead of refusing it with 429.
	FairShareWait bool
	// NewcomerHeadroom holds a tenant's stream, in its first holding time,
	// to the share it would have beside one more tenant of the default
	// weight, alone or not (fleet.go youngOverLocked).
	NewcomerHeadroom bool
	// PackOverShare places a tenant that wants more than its weighted share
	// on average, while another tenant is active, on workers in a fixed
	// fleet-wide order instead of by the policy (Ticket.Packed): it fills as
	// few engines as its share needs and leaves the others' headroom on the
	// rest.
	PackOverShare bool
	// TenantWeight is a tenant's weight in fair shares (tenant_policies'
	// weight); DefaultWeight the weight of every other tenant.
	TenantWeight  map[string]float64
	DefaultWeight float64
	// Problems are the configuration's mistakes that were not fatal, each
	// naming the fallback taken: the router logs them as errors.
	Problems []string
	// TenantMetricTopN bounds the tenant label: tenants past the first N
	// (configured tenants first) are labelled "other".
	TenantMetricTopN int
	// Now is the clock (nil: time.Now): the router passes its own.
	Now func() time.Time
}

// DefaultTenantHeader is the header a trusted tenant id is read from.
const DefaultTenantHeader = "x-smg-tenant-id"

// DefaultSchedulerConfig returns SMG's built-in per-class defaults.
func DefaultSchedulerConfig() SchedulerConfig {
	sec := func(n int) time.Duration { return time.Duration(n) * time.Second }
	return SchedulerConfig{
		Classes: [NumClasses]ClassConfig{
			System:      {Reserved: 32, QueueSize: 64, QueueTimeout: sec(30), StarvationThreshold: sec(5), CanPreempt: true},
			Interactive: {Reserved: 128, QueueSize: 256, QueueTimeout: sec(30), StarvationThreshold: sec(5), CanPreempt: true},
			Default:     {Reserved: 0, QueueSize: 512, QueueTimeout: sec(60), StarvationThreshold: sec(30)},
			Bulk:        {Reserved: 0, QueueSize: 1024, QueueTimeout: sec(300), StarvationThreshold: sec(120)},
		},
		DefaultMaxClass:  Default,
		TenantMaxClass:   map[string]Class{},
		TenantWeight:     map[string]float64{},
		DefaultWeight:    1,
		APIKeys:          map[string]string{},
		TenantHeader:     DefaultTenantHeader,
		TenantMetricTopN: 32,
	}
}

// fileClass is one class block of the YAML; nil fields keep the default.
type fileClass struct {
	Reserved                *int64   `yaml:"reserved"`
	QueueSize               *int     `yaml:"queue_size"`
	QueueTimeoutSecs        *float64 `yaml:"queue_timeout_secs"`
	StarvationThresholdSecs *float64 `yaml:"starvation_threshold_secs"`
	CanPreempt              *bool    `yaml:"can_preempt"`
	ReserveDemand           *bool    `yaml:"reserve_demand"`
	TTFTObjectiveSecs       *float64 `yaml:"ttft_objective_secs"`
}

type fileConfig struct {
	Classes        map[string]fileClass `yaml:"classes"`
	TenantPolicies map[string]struct {
		MaxClass *string  `yaml:"max_class"`
		Weight   *float64 `yaml:"weight"`
	} `yaml:"tenant_policies"`
	FairShare *struct {
		Enabled          bool     `yaml:"enabled"`
		DefaultWeight    *float64 `yaml:"default_weight"`
		RefuseOverShare  *bool    `yaml:"refuse_over_share"`
		NewcomerHeadroom *bool    `yaml:"newcomer_headroom"`
		PackOverShare    *bool    `yaml:"pack_over_share"`
	} `yaml:"fair_share"`
	APIKeys           map[string]string `yaml:"api_keys"`
	TrustTenantHeader *bool             `yaml:"trust_tenant_header"`
	TenantHeaderName  *string           `yaml:"tenant_header_name"`
}

// LoadSchedulerConfig reads the YAML at path over base.
func LoadSchedulerConfig(path string, base SchedulerConfig) (SchedulerConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return base, err
	}
	return ParseSchedulerConfig(data, base)
}

// ParseSchedulerConfig applies a YAML document over base. Both maps are optional;
// unknown keys and unknown class names are errors, as is every value out of
// range: the caller falls back rather than run a half-understood policy.
func ParseSchedulerConfig(data []byte, base SchedulerConfig) (SchedulerConfig, error) {
	var f fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return base, fmt.Errorf("scheduler config: %w", err)
	}
	c := base
	c.TenantMaxClass = make(map[string]Class, len(base.TenantMaxClass)+len(f.TenantPolicies))
	for k, v := range base.TenantMaxClass {
		c.TenantMaxClass[k] = v
	}
	c.TenantWeight = make(map[string]float64, len(base.TenantWeight)+len(f.TenantPolicies))
	for k, v := range base.TenantWeight {
		c.TenantWeight[k] = v
	}
	c.Problems = append([]string(nil), base.Problems...)
	c.APIKeys = make(map[string]string, len(base.APIKeys)+len(f.APIKeys))
	for k, v := range base.APIKeys {
		c.APIKeys[k] = v
	}
	var errs []error
	for name, fc := range f.Classes {
		cl, ok := classByName(name)
		if !ok {
			errs = append(errs, fmt.Errorf("classes.%s: unknown class (want system, interactive, default or bulk)", name))
			continue
		}
		cc := &c.Classes[cl]
		if fc.Reserved != nil {
			cc.Reserved = *fc.Reserved
		}
		if fc.QueueSize != nil {
			cc.QueueSize = *fc.QueueSize
		}
		if fc.QueueTimeoutSecs != nil {
			cc.QueueTimeout = seconds(*fc.QueueTimeoutSecs)
		}
		if fc.StarvationThresholdSecs != nil {
			cc.StarvationThreshold = seconds(*fc.StarvationThresholdSecs)
		}
		if fc.CanPreempt != nil {
			cc.CanPreempt = *fc.CanPreempt
		}
		if fc.ReserveDemand != nil {
			cc.ReserveDemand = *fc.ReserveDemand
		}
		if fc.TTFTObjectiveSecs != nil {
			d, err := ObjectiveFromSecs(*fc.TTFTObjectiveSecs)
			if err != nil {
				errs = append(errs, fmt.Errorf("classes.%s.ttft_objective_secs %w (omit it for no objective)", name, err))
			}
			cc.TTFTObjective = d
		}
	}
	if fs := f.FairShare; fs != nil {
		c.FairShare = fs.Enabled
		if fs.RefuseOverShare != nil {
			c.FairShareWait = !*fs.RefuseOverShare
		}
		if fs.NewcomerHeadroom != nil {
			c.NewcomerHeadroom = *fs.NewcomerHeadroom
		}
		if fs.PackOverShare != nil {
			c.PackOverShare = *fs.PackOverShare
		}
		if fs.DefaultWeight != nil {
			if w := *fs.DefaultWeight; validWeight(w) {
				c.DefaultWeight = w
			} else {
				c.Problems = append(c.Problems, fmt.Sprintf("fair_share.default_weight must be a number > 0 and <= %g, got %g: using 1", maxWeight, w))
			}
		}
	}
	for tenant, p := range f.TenantPolicies {
		if p.MaxClass != nil {
			cl, ok := classByName(*p.MaxClass)
			if !ok {
				errs = append(errs, fmt.Errorf("tenant_policies.%q.max_class: unknown class %q", tenant, *p.MaxClass))
				continue
			}
			c.TenantMaxClass[tenant] = cl
		}
		if p.Weight != nil {
			if w := *p.Weight; validWeight(w) {
				c.TenantWeight[tenant] = w
			} else {
				c.Problems = append(c.Problems, fmt.Sprintf("tenant_policies.%q.weight must be a number > 0 and <= %g, got %g: the tenant gets fair_share.default_weight", tenant, maxWeight, w))
			}
		}
	}
	for key, tenant := range f.APIKeys {
		if key == "" || tenant == "" {
			errs = append(errs, errors.New("api_keys: an empty key or tenant name"))
			continue
		}
		c.APIKeys[key] = tenant
	}
	if f.TrustTenantHeader != nil {
		c.TrustTenantHeader = *f.TrustTenantHeader
	}
	if f.TenantHeaderName != nil {
		c.TenantHeader = *f.TenantHeaderName
	}
	for tenant := range f.TenantPolicies {
		if p := c.unknownTenant(tenant); p != "" {
			c.Problems = append(c.Problems, fmt.Sprintf("tenant_policies.%q: %s: the policy applies to no caller", tenant, p))
		}
	}
	if err := errors.Join(append(errs, c.Validate())...); err != nil {
		return base, fmt.Errorf("scheduler config: %w", err)
	}
	return c, nil
}

// Validate rejects values the scheduler cannot run with.
func (c SchedulerConfig) Validate() error {
	var errs []error
	for _, cl := range Classes {
		cc := c.Classes[cl]
		if cc.Reserved < 0 || cc.Reserved > MaxReserved {
			errs = append(errs, fmt.Errorf("classes.%s.reserved must be >= 0 and <= %d, got %d", cl, MaxReserved, cc.Reserved))
		}
		if cc.QueueSize < 0 {
			errs = append(errs, fmt.Errorf("classes.%s.queue_size must be >= 0, got %d", cl, cc.QueueSize))
		}
		if cc.QueueTimeout <= 0 {
			errs = append(errs, fmt.Errorf("classes.%s.queue_timeout_secs must be > 0", cl))
		}
		if cc.StarvationThreshold <= 0 {
			errs = append(errs, fmt.Errorf("classes.%s.starvation_threshold_secs must be > 0", cl))
		}
	}
	if c.DefaultMaxClass >= NumClasses {
		errs = append(errs, errors.New("default max class out of range"))
	}
	if c.TrustTenantHeader && c.TenantHeader == "" {
		errs = append(errs, errors.New("trust_tenant_header needs a tenant_header_name"))
	}
	if c.TenantMetricTopN < 0 {
		errs = append(errs, fmt.Errorf("tenant metric top N must be >= 0, got %d", c.TenantMetricTopN))
	}
	return errors.Join(errs...)
}

// MaxReserved bounds a class's reservation: the sums and proportions of
// the reservations stay far from overflowing (a larger one would let more
// requests in than the capacity).
const MaxReserved = 1 << 20

// maxWeight bounds a tenant's weight: counters divide by it.
const maxWeight = 1e6

func validWeight(w float64) bool { return w > 0 && w <= maxWeight }

// Weight is the tenant's weight in fair shares.
func (c *SchedulerConfig) Weight(tenant string) float64 {
	if w, ok := c.TenantWeight[tenant]; ok {
		return w
	}
	return c.DefaultWeight
}

// unknownTenant says why a policy's tenant key can never be a caller's
// (Tenant's spellings), or "" when it can.
func (c *SchedulerConfig) unknownTenant(key string) string {
	name, ok := strings.CutPrefix(key, "auth:")
	switch {
	case ok:
		for _, t := range c.APIKeys {
			if t == name {
				return ""
			}
		}
		return "no api_keys entry names tenant " + strconv.Quote(name)
	case strings.HasPrefix(key, "header:"):
		if !c.TrustTenantHeader {
			return "trust_tenant_header is off, so no caller is a header: tenant"
		}
		return ""
	case strings.HasPrefix(key, "ip:"), key == "anonymous":
		return ""
	}
	return `not a tenant key (want "auth:<name>", "header:<id>", "ip:<address>" or "anonymous")`
}

// ReservesDemand reports whether any class's reservation follows its demand.
func (c SchedulerConfig) ReservesDemand() bool {
	for _, cc := range c.Classes {
		if cc.ReserveDemand {
			return true
		}
	}
	return false
}

// ReservedTotal is the sum of every class's reservation.
func (c SchedulerConfig) ReservedTotal() int64 {
	var n int64
	for _, cc := range c.Classes {
		n += cc.Reserved
	}
	return n
}

// classByName is the YAML's spelling: lowercase names only.
func classByName(s string) (Class, bool) {
	for i, n := range classNames {
		if s == n {
			return Class(i), true
		}
	}
	return 0, false
}

func seconds(s float64) time.Duration {
	if math.IsNaN(s) || s <= 0 {
		return 0 // rejected by Validate
	}
	if s > 1e6 {
		s = 1e6
	}
	return time.Duration(s * float64(time.Second))
}
