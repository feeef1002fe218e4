package admin

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/controlplane/store"
)

// pausedTokens holds its first read of the tokens until resumed, as a slow
// goroutine would between reading the registry and publishing the table.
type pausedTokens struct {
	store.Registry
	once           sync.Once
	paused, resume chan struct{}
}

func (p *pausedTokens) Tokens() ([]*store.Token, error) {
	toks, err := p.Registry.Tokens()
	first := false
	p.once.Do(func() { first = true })
	if first {
		close(p.paused)
		<-p.resume
	}
	return toks, err
}

// authSeen is a cluster that records the last token table it was given.
type authSeen struct {
	Cluster
	mu  sync.Mutex
	ids []string
}

func (a *authSeen) SetAuth(_ bool, grants []auth.Grant) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ids = a.ids[:0]
	for _, g := range grants {
		a.ids = append(a.ids, g.ID)
	}
	slices.Sort(a.ids)
}

// Two token writes' table loads publish in the order they read the
// registry: a load that read before another write cannot publish after
// that write's load and leave its token unknown to the data planes (seen
// as a 401 for an acknowledged token after a partition, when a write
// abandoned by its failover client finished beside the next one).
func TestTokenLoadsDoNotRegress(t *testing.T) {
	bolt, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	mk := func(id string) {
		t.Helper()
		_, g, err := auth.New([]string{auth.ScopeInvoke}, nil, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := bolt.CreateToken(&store.Token{ID: id, Name: id, Scopes: g.Scopes, Hash: g.Hash, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	mk("a")
	st := &pausedTokens{Registry: bolt, paused: make(chan struct{}), resume: make(chan struct{})}
	seen := &authSeen{}
	checker := auth.NewChecker()
	srv := New(Config{}, seen, checker)
	srv.Open(st)

	first := make(chan error, 1)
	go func() { first <- srv.LoadTokens() }() // reads {a}, then pauses
	<-st.paused
	mk("c")
	second := make(chan error, 1)
	go func() { second <- srv.LoadTokens() }()
	// Give the second load the chance to publish first, as it did before
	// loads were ordered; with them ordered it waits for the first, so
	// this bound only decides how long the first stays paused.
	select {
	case err := <-second:
		second <- err
	case <-time.After(100 * time.Millisecond):
	}
	close(st.resume)
	for _, ch := range []chan error{first, second} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	seen.mu.Lock()
	defer seen.mu.Unlock()
	if !slices.Equal(seen.ids, []string{"a", "c"}) {
		t.Errorf("the data planes' last token table: %v, want [a c]", seen.ids)
	}
	if checker.Len() != 2 {
		t.Errorf("the admin API's checker knows %d tokens, want 2", checker.Len())
	}
}
