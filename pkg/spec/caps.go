package spec

import (
	"fmt"
	"time"
)

// Caps are the operator's hard limits on a spec: a spec may never ask for
// more than they allow, whoever sends it. Validate keeps only what is
// meaningful at all; Caps keep what this cluster permits.
type Caps struct {
	MaxScale        int           // scaling.min, scaling.max; also the bound of an unbounded max
	MaxConcurrency  int           // concurrency
	MaxMilliCPU     int64         // resources.cpu_milli, limits.cpu_milli
	MaxMemoryMB     int64         // resources.memory_mb, limits.memory_mb
	MaxQueueDepth   int           // queue.depth
	MaxQueueTimeout time.Duration // queue.timeout
	MaxTimeout      time.Duration // timeout
}

// DefaultCaps are the limits of a cluster whose operator set none.
func DefaultCaps() Caps {
	return Caps{
		MaxScale:        10_000,
		MaxConcurrency:  10_000,
		MaxMilliCPU:     64_000,
		MaxMemoryMB:     64 << 10,
		MaxQueueDepth:   100_000,
		MaxQueueTimeout: 15 * time.Minute,
		MaxTimeout:      time.Hour,
	}
}

// WithDefaults fills zero caps from DefaultCaps.
func (c Caps) WithDefaults() Caps {
	d := DefaultCaps()
	orDefault(&c.MaxScale, d.MaxScale)
	orDefault(&c.MaxConcurrency, d.MaxConcurrency)
	orDefault(&c.MaxMilliCPU, d.MaxMilliCPU)
	orDefault(&c.MaxMemoryMB, d.MaxMemoryMB)
	orDefault(&c.MaxQueueDepth, d.MaxQueueDepth)
	orDefault(&c.MaxQueueTimeout, d.MaxQueueTimeout)
	orDefault(&c.MaxTimeout, d.MaxTimeout)
	return c
}

func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Check reports the first field of f (defaults applied) above its cap, as
// an error wrapping ErrInvalid that names the field and the limit.
func (c Caps) Check(f *Function) error {
	over := func(field string, v, limit any) error {
		return fmt.Errorf("%w: %s: %v is above this cluster's limit %v", ErrInvalid, field, v, limit)
	}
	switch {
	case f.Scaling.Min > c.MaxScale:
		return over("scaling.min", f.Scaling.Min, c.MaxScale)
	case f.Scaling.Max > c.MaxScale:
		return over("scaling.max", f.Scaling.Max, c.MaxScale)
	case f.Concurrency > c.MaxConcurrency:
		return over("concurrency", f.Concurrency, c.MaxConcurrency)
	case f.Resources.MilliCPU > c.MaxMilliCPU:
		return over("resources.cpu_milli", f.Resources.MilliCPU, c.MaxMilliCPU)
	case f.Limits.MilliCPU > c.MaxMilliCPU:
		return over("limits.cpu_milli", f.Limits.MilliCPU, c.MaxMilliCPU)
	case f.Resources.MemoryMB > c.MaxMemoryMB:
		return over("resources.memory_mb", f.Resources.MemoryMB, c.MaxMemoryMB)
	case f.Limits.MemoryMB > c.MaxMemoryMB:
		return over("limits.memory_mb", f.Limits.MemoryMB, c.MaxMemoryMB)
	case f.Queue.Depth > c.MaxQueueDepth:
		return over("queue.depth", f.Queue.Depth, c.MaxQueueDepth)
	case time.Duration(f.Queue.Timeout) > c.MaxQueueTimeout:
		return over("queue.timeout", f.Queue.Timeout, c.MaxQueueTimeout)
	case time.Duration(f.Timeout) > c.MaxTimeout:
		return over("timeout", f.Timeout, c.MaxTimeout)
	}
	return nil
}
