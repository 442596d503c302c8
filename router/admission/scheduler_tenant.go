package admission

import (
	"net"
	"net/http"
	"strings"
)

// Tenant returns the caller's tenant key, in SMG's spelling: "auth:<name>"
// when the bearer token is a configured API key, "header:<id>" from the
// tenant header only when the config trusts it, else "ip:<address>", else
// "anonymous". A client therefore cannot pick its tenant (nor its ceiling)
// unless the operator said headers are trusted.
func (c *SchedulerConfig) Tenant(h http.Header, remoteAddr string) string {
	if auth := h.Get("Authorization"); len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
		if name, ok := c.APIKeys[strings.TrimSpace(auth[7:])]; ok {
			return "auth:" + name
		}
	}
	if c.TrustTenantHeader {
		if id := strings.TrimSpace(h.Get(c.TenantHeader)); id != "" {
			return "header:" + id
		}
	}
	if host, _, err := net.SplitHostPort(remoteAddr); err == nil && host != "" {
		return "ip:" + host
	}
	return "anonymous"
}

// MaxClass is the tenant's ceiling: its policy, else the default.
func (c *SchedulerConfig) MaxClass(tenant string) Class {
	if cl, ok := c.TenantMaxClass[tenant]; ok {
		return cl
	}
	return c.DefaultMaxClass
}
