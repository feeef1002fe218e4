package naming

import "testing"

func TestHostLabel(t *testing.T) {
	for in, want := range map[string]string{
		"hello.brisk.local": "hello", "Hello.Example.COM": "hello", "hello:8080": "hello",
		"hello": "hello", "": "", "127.0.0.1:8080": "127", "[::1]:8080": "[", "HeLLo": "hello",
	} {
		if got := HostLabel(in); got != want {
			t.Errorf("HostLabel(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestHostLabels(t *testing.T) {
	for in, want := range map[string][2]string{
		"hello.team-a.example.com": {"hello", "hello.team-a"}, "Hello.Team-A.Example.COM:80": {"hello", "hello.team-a"},
		"hello.brisk": {"hello", "hello.brisk"}, "hello:8080": {"hello", "hello"}, "hello": {"hello", "hello"},
		"": {"", ""}, "127.0.0.1:8080": {"127", "127.0"},
	} {
		if first, two := HostLabels(in); first != want[0] || two != want[1] {
			t.Errorf("HostLabels(%q) = %q, %q, want %q, %q", in, first, two, want[0], want[1])
		}
	}
}

func TestNamesFunction(t *testing.T) {
	for in, want := range map[string]bool{"hello": true, "f-1": true, "": false, "localhost": false, "127": false, "[": false} {
		if got := NamesFunction(in); got != want {
			t.Errorf("NamesFunction(%q) = %v, want %v", in, got, want)
		}
	}
}
