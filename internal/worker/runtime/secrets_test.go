package runtime

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/brisk-faas/brisk/pkg/spec"
)

func TestCheckSecrets(t *testing.T) {
	ok := &spec.Function{Name: "f", Secrets: []string{"a", "b.c"}, SecretData: map[string][]byte{"a": {}, "b.c": []byte("v")}}
	if err := CheckSecrets(ok); err != nil {
		t.Errorf("valid secrets: %v", err)
	}
	if err := CheckSecrets(&spec.Function{Name: "f"}); err != nil {
		t.Errorf("no secrets: %v", err)
	}
	many := &spec.Function{Name: "f", SecretData: map[string][]byte{}}
	for i := range spec.MaxSecretsPerFunction + 1 {
		n := fmt.Sprintf("s%d", i)
		many.Secrets = append(many.Secrets, n)
		many.SecretData[n] = nil
	}
	for name, c := range map[string]struct {
		f    *spec.Function
		want string
	}{
		"missing value": {&spec.Function{Name: "f", Secrets: []string{"gone"}, SecretData: map[string][]byte{}}, `"gone"`},
		"path":          {&spec.Function{Name: "f", Secrets: []string{"../x"}, SecretData: map[string][]byte{"../x": nil}}, `"../x"`},
		"slash":         {&spec.Function{Name: "f", Secrets: []string{"a/b"}, SecretData: map[string][]byte{"a/b": nil}}, `"a/b"`},
		"twice":         {&spec.Function{Name: "f", Secrets: []string{"a", "a"}, SecretData: map[string][]byte{"a": nil}}, `"a"`},
		"too large": {&spec.Function{Name: "f", Secrets: []string{"big"},
			SecretData: map[string][]byte{"big": make([]byte, spec.MaxSecretSize+1)}}, `"big"`},
		"too many": {many, "at most"},
	} {
		err := CheckSecrets(c.f)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", name, err, c.want)
		}
	}
}

func TestWriteSecrets(t *testing.T) {
	dir := t.TempDir()
	f := &spec.Function{Name: "f", Secrets: []string{"a", "bin"}, SecretData: map[string][]byte{"a": []byte("x"), "bin": {0, '\n', 0xff}}}
	old := syscall.Umask(0o077)
	err := WriteSecrets(dir, f)
	syscall.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range f.SecretData {
		p := filepath.Join(dir, name)
		st, err := os.Lstat(p)
		if err != nil || st.Mode() != 0o444 {
			t.Errorf("%s: %v, %v; want a regular file of mode 0444 whatever the umask", name, st.Mode(), err)
		}
		if b, _ := os.ReadFile(p); !bytes.Equal(b, v) {
			t.Errorf("%s holds %q, want %q", name, b, v)
		}
	}
	// Nothing there already is replaced or followed.
	dir = t.TempDir()
	target := filepath.Join(t.TempDir(), "target")
	if err := os.Symlink(target, filepath.Join(dir, "a")); err != nil {
		t.Fatal(err)
	}
	if err := WriteSecrets(dir, f); err == nil || !strings.Contains(err.Error(), `"a"`) {
		t.Errorf("WriteSecrets over a symlink = %v, want an error naming the secret", err)
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Errorf("WriteSecrets followed a symlink to %s", target)
	}
}

func TestSecretsTmpfsData(t *testing.T) {
	page := os.Getpagesize()
	f := &spec.Function{Secrets: []string{"a", "b"}, SecretData: map[string][]byte{"a": make([]byte, page+1), "b": nil}}
	want := fmt.Sprintf("mode=0755,size=%d,nr_inodes=18", 18*page)
	if got := SecretsTmpfsData(f); got != want {
		t.Errorf("SecretsTmpfsData = %q, want %q", got, want)
	}
}
