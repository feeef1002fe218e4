package auth

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

func mustNew(t *testing.T, scopes, fns []string) (string, Grant) {
	t.Helper()
	tok, g, err := New(scopes, fns, "")
	if err != nil {
		t.Fatal(err)
	}
	return tok, g
}

func TestNewTokenForm(t *testing.T) {
	tok, g := mustNew(t, []string{ScopeInvoke}, nil)
	if !strings.HasPrefix(tok, "brisk_"+g.ID+"_") || len(g.ID) != 16 || len(tok) != len("brisk_")+16+1+43 {
		t.Fatalf("token %q id %q", tok, g.ID)
	}
	if strings.Contains(g.Hash, tok[len("brisk_")+17:]) || len(g.Hash) != 64 {
		t.Fatalf("hash %q", g.Hash)
	}
	if ID(tok) != g.ID || ID("garbage") != "" {
		t.Fatal("ID")
	}
	other, g2 := mustNew(t, []string{ScopeInvoke}, nil)
	if other == tok || g2.ID == g.ID {
		t.Fatal("two tokens alike")
	}
	for _, bad := range [][]string{nil, {"root"}, {ScopeInvoke, "x"}} {
		if _, _, err := New(bad, nil, ""); err == nil {
			t.Errorf("scopes %v accepted", bad)
		}
	}
}

func TestCheck(t *testing.T) {
	c := NewChecker()
	admin, ga := mustNew(t, []string{ScopeAdmin}, nil)
	deploy, gd := mustNew(t, []string{ScopeDeploy}, nil)
	narrow, gn := mustNew(t, []string{ScopeInvoke, ScopeDeploy}, []string{"a"})
	unknown, _ := mustNew(t, []string{ScopeAdmin}, nil)
	c.Replace([]Grant{ga, gd, gn})
	if c.Len() != 3 {
		t.Fatalf("Len %d", c.Len())
	}
	tampered := deploy[:len(deploy)-1] + string('A'+(deploy[len(deploy)-1]-'A'+1)%26)
	for _, tc := range []struct {
		tok, scope, fn string
		want           error
	}{
		{admin, ScopeInvoke, "any", nil},
		{admin, ScopeAdmin, "", nil},
		{deploy, ScopeDeploy, "", nil},
		{deploy, ScopeDeploy, "f", nil},
		{deploy, ScopeInvoke, "f", ErrForbidden},
		{deploy, ScopeAdmin, "", ErrForbidden},
		{narrow, ScopeInvoke, "a", nil},
		{narrow, ScopeDeploy, "a", nil},
		{narrow, ScopeInvoke, "b", ErrForbidden},
		{narrow, ScopeDeploy, "", ErrForbidden},
		{unknown, ScopeInvoke, "a", ErrBadToken},
		{tampered, ScopeDeploy, "", ErrBadToken},
		{"", ScopeInvoke, "a", ErrNoToken},
		{"brisk_short", ScopeInvoke, "a", ErrBadToken},
		{"Bearer " + admin, ScopeInvoke, "a", ErrBadToken},
	} {
		if err := Check(c, tc.tok, tc.scope, "ns", tc.fn); !errors.Is(err, tc.want) && !(err == nil && tc.want == nil) {
			t.Errorf("Check(%.20s…, %s, %q) = %v, want %v", tc.tok, tc.scope, tc.fn, err, tc.want)
		}
		if err := Check(c, []byte(tc.tok), tc.scope, "ns", tc.fn); !errors.Is(err, tc.want) && !(err == nil && tc.want == nil) {
			t.Errorf("Check([]byte) = %v, want %v", err, tc.want)
		}
	}
	// Revocation: a new set without the token.
	c.Replace([]Grant{ga})
	if err := Check(c, deploy, ScopeDeploy, "ns", ""); !errors.Is(err, ErrBadToken) {
		t.Fatalf("revoked token: %v", err)
	}
	// A grant with a malformed hash is skipped, not a panic or a pass.
	c.Replace([]Grant{{ID: gd.ID, Hash: "zz", Scopes: []string{ScopeAdmin}}})
	if err := Check(c, deploy, ScopeDeploy, "ns", ""); !errors.Is(err, ErrBadToken) {
		t.Fatalf("malformed grant: %v", err)
	}
}

func TestCheckBytesDoesNotAllocate(t *testing.T) {
	c := NewChecker()
	tok, g := mustNew(t, []string{ScopeInvoke}, []string{"f"})
	c.Replace([]Grant{g})
	b := []byte(tok)
	if n := testing.AllocsPerRun(100, func() {
		if Check(c, b, ScopeInvoke, "ns", "f") != nil {
			t.Fatal("refused")
		}
	}); n != 0 {
		t.Fatalf("%v allocations per check", n)
	}
}

func TestFromHeader(t *testing.T) {
	basic := func(s string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct {
		v, want string
		ok      bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer  abc ", "abc", true},
		{basic("user:abc"), "abc", true},
		{basic("user:a:b"), "a:b", true},
		{basic("nopass"), "", false},
		{basic("user:"), "", false},
		{"Basic !!!", "", false},
		{"Bearer", "", false},
		{"Digest abc", "", false},
		{"", "", false},
	} {
		got, ok := FromHeader(tc.v)
		if got != tc.want || ok != tc.ok {
			t.Errorf("FromHeader(%q) = %q %v, want %q %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}

// invokeChecker is a checker that knows one invoke token, tok.
func invokeChecker(tb testing.TB) (c *Checker, tok string) {
	tb.Helper()
	c = NewChecker()
	tok, g, err := New([]string{ScopeInvoke}, nil, "")
	if err != nil {
		tb.Fatal(err)
	}
	c.Replace([]Grant{g})
	return c, tok
}

func BenchmarkCheck(b *testing.B) {
	c, tok := invokeChecker(b)
	// A data plane checks the header's bytes; the admin API a string.
	b.Run("bytes", func(b *testing.B) {
		bt := []byte(tok)
		b.ReportAllocs()
		for b.Loop() {
			_ = Check(c, bt, ScopeInvoke, "ns", "f")
		}
	})
	b.Run("string", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = Check(c, tok, ScopeInvoke, "ns", "f")
		}
	})
}

func TestNamespacedTokens(t *testing.T) {
	c := NewChecker()
	teamA, ga, err := New([]string{ScopeDeploy, ScopeInvoke}, nil, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := New([]string{ScopeAdmin}, nil, "team-a"); err == nil {
		t.Fatal("a namespaced admin token was made")
	}
	c.Replace([]Grant{ga})
	for _, tc := range []struct {
		scope, ns, fn string
		want          error
	}{
		{ScopeInvoke, "team-a", "f", nil},
		{ScopeDeploy, "team-a", "", nil},
		{ScopeInvoke, "team-b", "f", ErrForbidden},
		{ScopeDeploy, "", "", ErrForbidden},
		{ScopeAdmin, "team-a", "", ErrForbidden},
	} {
		if err := Check(c, teamA, tc.scope, tc.ns, tc.fn); !errors.Is(err, tc.want) && !(err == nil && tc.want == nil) {
			t.Errorf("Check(%s, %q, %q) = %v, want %v", tc.scope, tc.ns, tc.fn, err, tc.want)
		}
	}
	if err := HasScope(c, teamA, ScopeDeploy); err != nil {
		t.Fatalf("HasScope deploy: %v", err)
	}
	if err := HasScope(c, teamA, ScopeAdmin); !errors.Is(err, ErrForbidden) {
		t.Fatalf("HasScope admin: %v", err)
	}
}

// TestGrantOf checks that a token made elsewhere (brisk k8s install) gets
// the very grant New gives it, so the Checker accepts it, and that
// malformed ones are refused.
func TestGrantOf(t *testing.T) {
	tok, want := mustNew(t, []string{ScopeJoin}, nil)
	g, err := GrantOf(tok, []string{ScopeJoin})
	if err != nil {
		t.Fatal(err)
	}
	if g.ID != want.ID || g.Hash != want.Hash || g.SigningKey != want.SigningKey {
		t.Fatalf("GrantOf = %+v, want %+v", g, want)
	}
	c := NewChecker()
	c.Replace([]Grant{g})
	if err := Check(c, tok, ScopeJoin, "", ""); err != nil {
		t.Errorf("the checker refuses the token: %v", err)
	}
	id := tok[len("brisk_") : len("brisk_")+16]
	for _, bad := range []string{"", "garbage", "brisk_" + id + "_", "brisk_" + id + "_short", "brisk_zzzzzzzzzzzzzzzz_" + tok[len("brisk_")+17:], "brisk_" + id + "_" + strings.Repeat("!", 43), "brisk_" + id + "_" + strings.Repeat("A", 43)} {
		if _, err := GrantOf(bad, []string{ScopeJoin}); err == nil {
			t.Errorf("GrantOf(%q) accepted", bad)
		}
	}
	if _, err := GrantOf(tok, nil); err == nil {
		t.Error("GrantOf without scopes accepted")
	}
}

// Check does not allocate, for a header's bytes or a string: the data
// plane checks every call, the admin API every request.
func TestCheckDoesNotAllocate(t *testing.T) {
	c, tok := invokeChecker(t)
	bt := []byte(tok)
	if n := testing.AllocsPerRun(100, func() { _ = Check(c, bt, ScopeInvoke, "ns", "f") }); n != 0 {
		t.Errorf("Check of bytes: %v allocations", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = Check(c, tok, ScopeInvoke, "ns", "f") }); n != 0 {
		t.Errorf("Check of a string: %v allocations", n)
	}
}
