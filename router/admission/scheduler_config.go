package admission

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
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
		MaxClass string `yaml:"max_class"`
	} `yaml:"tenant_policies"`
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
	for tenant, p := range f.TenantPolicies {
		cl, ok := classByName(p.MaxClass)
		if !ok {
			errs = append(errs, fmt.Errorf("tenant_policies.%q.max_class: unknown class %q", tenant, p.MaxClass))
			continue
		}
		c.TenantMaxClass[tenant] = cl
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
		if cc.Reserved < 0 {
			errs = append(errs, fmt.Errorf("classes.%s.reserved must be >= 0, got %d", cl, cc.Reserved))
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
