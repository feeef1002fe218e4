package controlplane

import (
	"slices"

	"github.com/brisk-faas/brisk/internal/controlplane/store"
	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// The cluster's copy of the secrets: what sandboxes get at create, and
// what the admin surface checks specs and quotas against.

// SetSecrets replaces the cluster's secrets: sandboxes created from now on
// see their values.
func (c *Cluster) SetSecrets(secs []*store.Secret) {
	m := make(map[string]*store.Secret, len(secs))
	for _, s := range secs {
		m[s.Key()] = s
	}
	c.mu.Lock()
	c.secrets = m
	c.secretGen++
	c.mu.Unlock()
}

// PutSecret records what the registry now holds under key: s, or nothing
// for nil. The caller holds secretMu.
func (c *Cluster) PutSecret(key string, s *store.Secret) {
	c.mu.Lock()
	if s == nil {
		delete(c.secrets, key)
	} else {
		if c.secrets == nil {
			c.secrets = map[string]*store.Secret{}
		}
		c.secrets[key] = s
	}
	c.secretGen++
	c.mu.Unlock()
}

// secretDataLocked returns the values of the secrets f names and the
// generation they belong to; nil and 0 for a function that names none, so
// that the common case costs nothing. A missing secret is left out: the
// worker then refuses to start the sandbox and says which one.
func (c *Cluster) secretDataLocked(f *spec.Function) (map[string][]byte, uint64) {
	if len(f.Secrets) == 0 {
		return nil, 0
	}
	ns := namespaceOf(f)
	m := make(map[string][]byte, len(f.Secrets))
	for _, n := range f.Secrets {
		if s, ok := c.secrets[store.SecretKey(ns, n)]; ok {
			m[n] = s.Value
		}
	}
	return m, c.secretGen
}

// MissingSecrets returns those of names that are no secret of namespace ns.
func (c *Cluster) MissingSecrets(ns string, names []string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, n := range names {
		if _, ok := c.secrets[store.SecretKey(ns, n)]; !ok {
			out = append(out, n)
		}
	}
	return out
}

// SecretUsers returns the functions of namespace ns that name secret name.
func (c *Cluster) SecretUsers(ns, name string) []string {
	var out []string
	c.mu.Lock()
	c.r.Functions(func(f *spec.Function, _ api.FunctionStatus) {
		if namespaceOf(f) == ns && slices.Contains(f.Secrets, name) {
			out = append(out, f.Name)
		}
	})
	c.mu.Unlock()
	slices.Sort(out)
	return out
}

// SecretUsage returns the number of namespace ns's secrets and the bytes
// of their values, leaving out the secret called skip, and whether skip
// exists.
func (c *Cluster) SecretUsage(ns, skip string) (n int, bytes int64, exists bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.secrets {
		if s.Namespace != ns {
			continue
		}
		if s.Name == skip {
			exists = true
			continue
		}
		n++
		bytes += int64(len(s.Value))
	}
	return n, bytes, exists
}

// Secret returns namespace ns's secret name (nil: none), from the
// cluster's copy of the registry's: a read costs no registry scan.
func (c *Cluster) Secret(ns, name string) *store.Secret {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.secrets[store.SecretKey(ns, name)]
}

// SecretsIn is namespace ns's secrets, every namespace's for "".
func (c *Cluster) SecretsIn(ns string) []*store.Secret {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*store.Secret
	for _, s := range c.secrets {
		if ns == "" || s.Namespace == ns {
			out = append(out, s)
		}
	}
	return out
}
