package store

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/brisk-faas/brisk/pkg/spec"
)

func fn(name string) *spec.Function {
	f := &spec.Function{Name: name, Builtin: "trace", Revision: 1}
	f.ApplyDefaults()
	return f
}

func TestFunctionsSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateFunction(fn("a")); err != nil {
		t.Fatal(err)
	}
	b := fn("b")
	if _, err := s.CreateFunction(b); err != nil {
		t.Fatal(err)
	}
	b.Revision, b.Concurrency = 2, 7
	if err := s.UpdateFunction(b); err != nil {
		t.Fatal(err)
	}
	if err := s.PutWorker(&Worker{ID: "w1", Address: "127.0.0.1:1", Drain: true}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"t1", "t2"} {
		if err := s.CreateToken(&Token{ID: id, Name: id, Scopes: []string{"deploy"}, Hash: "ab"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateToken(&Token{ID: "t1"}); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate token id: %v", err)
	}
	if err := s.DeleteToken("t1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteToken("t1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleting a deleted token: %v", err)
	}
	raw := []byte("a\x00b\n\xff")
	for _, sec := range []*Secret{{Namespace: "default", Name: "s"}, {Namespace: "team-a", Name: "s"}, {Namespace: "default", Name: "gone"}} {
		if err := s.CreateSecret(sec); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateSecret(&Secret{Namespace: "team-a", Name: "s"}); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate secret: %v", err)
	}
	if err := s.UpdateSecret(&Secret{Namespace: "team-a", Name: "s", Value: raw}); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateSecret(&Secret{Namespace: "team-b", Name: "s"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("updating a missing secret: %v", err)
	}
	if err := s.DeleteSecret("default", "gone"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSecret("default", "gone"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleting a deleted secret: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fns, err := s.Functions()
	if err != nil || len(fns) != 2 {
		t.Fatalf("after reopen: %d functions, %v", len(fns), err)
	}
	if fns[1].Name != "b" || fns[1].Revision != 2 || fns[1].Concurrency != 7 {
		t.Fatalf("update lost: %+v", fns[1])
	}
	ws, err := s.Workers()
	if err != nil || len(ws) != 1 || !ws[0].Drain {
		t.Fatalf("workers after reopen: %+v, %v", ws, err)
	}
	ts, err := s.Tokens()
	if err != nil || len(ts) != 1 || ts[0].ID != "t2" || ts[0].Scopes[0] != "deploy" {
		t.Fatalf("tokens after reopen: %+v, %v", ts, err)
	}
	ss, err := s.Secrets()
	if err != nil || len(ss) != 2 || ss[0].Key() != "default/s" || ss[1].Key() != "team-a/s" || string(ss[1].Value) != string(raw) {
		t.Fatalf("secrets after reopen: %+v, %v", ss, err)
	}
}

func TestSentinelErrors(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.CreateFunction(fn("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateFunction(fn("a")); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate create: %v, want ErrExists", err)
	}
	if err := s.UpdateFunction(fn("nope")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("update missing: %v, want ErrNotFound", err)
	}
	if err := s.DeleteFunction("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete missing: %v, want ErrNotFound", err)
	}
	if err := s.DeleteFunction("a"); err != nil {
		t.Fatal(err)
	}
	if fns, _ := s.Functions(); len(fns) != 0 {
		t.Fatalf("deleted function still stored: %v", fns)
	}
}

// Writers sharing a group commit: a failing write (a duplicate) must not
// take the others down with it, and every acknowledged write is stored.
func TestGroupCommitIsolatesFailures(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	const n = 400
	var wg sync.WaitGroup
	errs := make([]error, 2*n)
	for i := 0; i < 2*n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.CreateFunction(fn(fmt.Sprintf("f-%d", i%n))) // every name twice
		}()
	}
	wg.Wait()
	ok, dup := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrExists):
			dup++
		default:
			t.Fatalf("unexpected error: %v", err)
		}
	}
	if ok != n || dup != n {
		t.Fatalf("%d created, %d duplicates; want %d and %d", ok, dup, n, n)
	}
	s.Close()
	s, _ = Open(dir)
	defer s.Close()
	if fns, _ := s.Functions(); len(fns) != n {
		t.Fatalf("%d functions durable, want %d", len(fns), n)
	}
}

// A function's replaced revisions are kept in order, at most MaxRevisions,
// across a reopen, and go with DeleteRevisions.
func TestRevisions(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for rev := uint64(1); rev <= MaxRevisions+5; rev++ {
		f := fn("a")
		f.Revision = rev
		if err := s.PutRevision(f); err != nil {
			t.Fatal(err)
		}
	}
	b := fn("ab") // a name that "a" is a prefix of: not in a's history
	b.Revision = 99
	if err := s.PutRevision(b); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	revs, err := s.Revisions("a")
	if err != nil || len(revs) != MaxRevisions || revs[0].Revision != 6 || revs[len(revs)-1].Revision != MaxRevisions+5 {
		t.Fatalf("revisions of a: %d (%v), want %d from 6", len(revs), err, MaxRevisions)
	}
	if err := s.DeleteRevisions("a"); err != nil {
		t.Fatal(err)
	}
	if revs, _ := s.Revisions("a"); len(revs) != 0 {
		t.Fatalf("after DeleteRevisions: %d", len(revs))
	}
	if revs, _ := s.Revisions("ab"); len(revs) != 1 || revs[0].Revision != 99 {
		t.Fatalf("another function's history: %+v", revs)
	}
}

// Code archives are kept by digest, once, and survive a reopen.
func TestCodeSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("z"), walSize) // past the log: bbolt's commit makes it durable
	for d, data := range map[string][]byte{"sha256:a": []byte("A"), "sha256:big": big} {
		if err := s.PutCode(d, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutCode("sha256:a", []byte("other")); err != nil { // the same digest: no change
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, err := s.Code("sha256:a"); err != nil || string(got) != "A" {
		t.Fatalf("code a: %q, %v", got, err)
	}
	if got, err := s.Code("sha256:big"); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("code big: %d bytes, %v", len(got), err)
	}
	if ds, err := s.CodeDigests(); err != nil || strings.Join(ds, ",") != "sha256:a,sha256:big" {
		t.Fatalf("digests %v, %v", ds, err)
	}
	if err := s.DeleteCode("sha256:a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Code("sha256:a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted code: %v", err)
	}
}
