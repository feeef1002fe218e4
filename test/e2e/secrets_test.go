package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/brisk-faas/brisk/pkg/api"
	"github.com/brisk-faas/brisk/pkg/client"
	"github.com/brisk-faas/brisk/pkg/spec"
)

// Secrets as the OpenFaaS certifier's Test_SecretCRUD uses them, through
// /system/secrets with faas-cli's requests: create (text and raw), list,
// a classic-watchdog function that cats /var/openfaas/secrets/NAME, an
// update plus redeploy that it then sees, and removal. Then brisk's own
// API: values never come back, a deploy naming a missing secret and the
// deletion of one in use are refused, and secrets survive a restart.
func TestSecrets(t *testing.T) {
	c := newCluster(t)
	p := c.up(t)
	tok, err := os.ReadFile(filepath.Join(c.dataDir, api.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	gw := "http://" + c.invokeAddr
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:"+strings.TrimSpace(string(tok))))
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{}}
	do := func(method, path, authz, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, gw+path, strings.NewReader(body))
		req.Header.Set("User-Agent", "faas-cli/0.17.0")
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	raw := []byte("line one\nnul\x00byte\xff")
	if code, body := do("POST", "/system/secrets", basic, `{"name":"secret-name","namespace":"openfaas-fn","value":"the value"}`); code/100 != 2 {
		t.Fatalf("secret create: %d %s", code, body)
	}
	// faas-cli secret create --from-file sends the file as both value and
	// rawValue (issue 38: refused with 400, and faas-cli exited 0).
	rawJSON, _ := json.Marshal(map[string]any{"name": "raw-secret", "value": string(raw), "rawValue": raw})
	if code, body := do("POST", "/system/secrets", basic, string(rawJSON)); code/100 != 2 {
		t.Fatalf("secret create (raw): %d %s", code, body)
	}
	if code, _ := do("POST", "/system/secrets", basic, `{"name":"secret-name","value":"again"}`); code != http.StatusConflict {
		t.Fatalf("creating a taken name: %d, want 409", code)
	}
	if code, _ := do("GET", "/system/secrets", "", ""); code != http.StatusUnauthorized {
		t.Fatalf("secret list without credentials: %d, want 401", code)
	}
	code, body := do("GET", "/system/secrets?namespace=openfaas-fn", basic, "")
	var list []struct{ Name, Namespace, Value string }
	if code != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list) != 2 || list[0].Namespace != "openfaas-fn" {
		t.Fatalf("secret list: %d %s", code, body)
	}
	if strings.Contains(body, "the value") {
		t.Fatalf("secret list shows a value: %s", body)
	}

	dep := `{"service":"secret-cat","image":"functions/alpine:latest","envProcess":"cat /var/openfaas/secrets/secret-name","secrets":["secret-name","raw-secret"]}`
	if code, body := do("PUT", "/system/functions", basic, dep); code != 404 {
		t.Fatalf("PUT of an unknown function: %d %s", code, body)
	}
	if code, body := do("POST", "/system/functions", basic, dep); code/100 != 2 {
		t.Fatalf("deploy: %d %s", code, body)
	}
	if _, body := do("GET", "/system/function/secret-cat", basic, ""); !strings.Contains(body, `"secrets":["secret-name","raw-secret"]`) {
		t.Fatalf("secrets not shown back: %s", body)
	}
	call := func(fn, in string) string {
		var got string
		eventually(t, 30*time.Second, fn+" answers", func() bool {
			code, body := do("POST", "/function/"+fn+".openfaas-fn", "", in)
			got = body
			return code == 200
		})
		return got
	}
	if got := call("secret-cat", ""); got != "the value" {
		t.Fatalf("the function read %q, want %q", got, "the value")
	}
	// The raw value, byte for byte, through a second watchdog function.
	if code, body := do("POST", "/system/functions", basic, `{"service":"raw-cat","image":"functions/alpine:latest","envProcess":"cat /var/openfaas/secrets/raw-secret","secrets":["raw-secret"]}`); code/100 != 2 {
		t.Fatalf("deploy raw-cat: %d %s", code, body)
	}
	if got := call("raw-cat", ""); got != string(raw) {
		t.Fatalf("raw-cat read %q, want %q", got, raw)
	}
	// The sandbox cannot write its secrets, nor see another function's
	// (fprocess sh runs the request body).
	if code, body := do("POST", "/system/functions", basic, `{"service":"secret-write","image":"functions/alpine:latest","envProcess":"sh","secrets":["raw-secret"]}`); code/100 != 2 {
		t.Fatalf("deploy secret-write: %d %s", code, body)
	}
	if got := call("secret-write", "echo x > /var/openfaas/secrets/raw-secret && echo wrote; ls /var/openfaas/secrets"); strings.Contains(got, "wrote") || strings.Contains(got, "secret-name") || !strings.Contains(got, "raw-secret") {
		t.Fatalf("secret-write: %q (want a failed write and only its own secret listed)", got)
	}

	// -secretUpdate: a new value, then a redeploy, and the function sees it.
	if code, body := do("PUT", "/system/secrets", basic, `{"name":"secret-name","namespace":"openfaas-fn","value":"the new value"}`); code/100 != 2 {
		t.Fatalf("secret update: %d %s", code, body)
	}
	if code, body := do("PUT", "/system/functions", basic, dep); code/100 != 2 {
		t.Fatalf("redeploy: %d %s", code, body)
	}
	eventually(t, 30*time.Second, "the redeployed function reads the new value", func() bool {
		code, body := do("POST", "/function/secret-cat.openfaas-fn", "", "")
		return code == 200 && body == "the new value"
	})
	if code, body := do("DELETE", "/system/secrets", basic, `{"name":"secret-name","namespace":"openfaas-fn"}`); code != http.StatusConflict || !strings.Contains(body, "secret-cat") {
		t.Fatalf("deleting a secret in use: %d %s, want 409 naming the function", code, body)
	}
	if code, _ := do("PUT", "/system/secrets", basic, `{"name":"no-such","value":"x"}`); code != 404 {
		t.Fatalf("updating a missing secret: %d, want 404", code)
	}

	// brisk's own API and CLI.
	ctx := context.Background()
	if _, err := c.cl.Create(ctx, mustSpec(t, `{"name":"missing-secret","builtin":"trace","secrets":["nope"]}`)); !isStatus(err, 400) || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("deploy naming a missing secret: %v, want 400 naming it", err)
	}
	if _, err := c.cl.CreateSecret(ctx, api.SecretRequest{Name: "Bad/Name", Value: "x"}); !isStatus(err, 400) {
		t.Fatalf("a bad secret name: %v, want 400", err)
	}
	if _, err := c.cl.CreateSecret(ctx, api.SecretRequest{Name: "big", RawValue: make([]byte, 1<<20+1)}); !isStatus(err, 413) {
		t.Fatalf("an oversized secret: %v, want 413", err)
	}
	c.mustBrisk(t, "secret", "create", "cli-secret", "--from-literal", "from the cli")
	if out := c.mustBrisk(t, "secret", "list"); !strings.Contains(out, "cli-secret") || strings.Contains(out, "from the cli") {
		t.Fatalf("brisk secret list:\n%s", out)
	}
	if out, code := c.brisk(t, "secret", "create", "cli-secret", "--from-literal", "x"); code == 0 || !strings.Contains(out, "already exists") {
		t.Fatalf("brisk secret create of a taken name: exit %d:\n%s", code, out)
	}
	c.mustBrisk(t, "fn", "deploy", "cli-cat", "--builtin", "watchdog", "--env", "fprocess=cat /var/openfaas/secrets/cli-secret", "--secret", "cli-secret", "--public")
	if got := string(c.invoke(t, "cli-cat", "").body); got != "from the cli" {
		t.Fatalf("cli-cat read %q", got)
	}

	// A restart: the registry keeps the secrets, and new sandboxes get them.
	p.stop(syscall.SIGTERM)
	c.up(t)
	c.mustBrisk(t, "fn", "deploy", "cli-cat-2", "--builtin", "watchdog", "--env", "fprocess=cat /var/openfaas/secrets/cli-secret", "--secret", "cli-secret", "--public")
	eventually(t, 30*time.Second, "cli-cat-2 answers after a restart", func() bool {
		inv := c.invoke(t, "cli-cat-2", "")
		return inv.status == 200 && string(inv.body) == "from the cli"
	})

	// Removal, as faas-cli secret remove, once no function uses it.
	for _, fn := range []string{"secret-cat", "raw-cat", "secret-write"} {
		if code, body := do("DELETE", "/system/functions", basic, `{"functionName":"`+fn+`"}`); code/100 != 2 {
			t.Fatalf("remove %s: %d %s", fn, code, body)
		}
	}
	if code, body := do("DELETE", "/system/secrets", basic, `{"name":"secret-name","namespace":"openfaas-fn"}`); code/100 != 2 {
		t.Fatalf("secret remove: %d %s", code, body)
	}
	if code, _ := do("DELETE", "/system/secrets", basic, `{"name":"secret-name"}`); code != 404 {
		t.Fatalf("secret remove again: %d, want 404", code)
	}
	if secs, err := c.cl.Secrets(ctx, ""); err != nil || len(secs) != 2 {
		t.Fatalf("secrets left: %+v %v, want raw-secret and cli-secret", secs, err)
	}
}

func isStatus(err error, code int) bool {
	var e *client.Error
	return errors.As(err, &e) && e.Status == code
}

func mustSpec(t *testing.T, js string) *spec.Function {
	t.Helper()
	f, err := spec.Decode([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// secretsCluster is a cluster with namespaces team-a (secrets db and
// api-key) and team-b (secret db), and a client for a token.
func secretsCluster(t *testing.T) (*cluster, func(tok string) *client.Client) {
	c := newCluster(t)
	c.up(t)
	for _, ns := range []string{"team-a", "team-b"} {
		c.mustBrisk(t, "ns", "create", ns)
		c.mustBrisk(t, "secret", "create", "db", "-n", ns, "--from-literal", ns+"'s password")
	}
	c.mustBrisk(t, "secret", "create", "api-key", "-n", "team-a", "--from-literal", "k")
	return c, func(tok string) *client.Client {
		cl := client.New(c.admin, c.invokeAddr)
		cl.Token = tok
		return cl
	}
}

// A deploy token limited to a function (here bound to no namespace) can
// neither manage secrets nor give its function secrets it did not have:
// the function's code would read them, from any namespace.
func TestSecretsFunctionLimitedToken(t *testing.T) {
	c, as := secretsCluster(t)
	ctx := context.Background()
	// f of team-a is f.team-a: a token bound to no namespace names it in full.
	fc := as(strings.TrimSpace(c.mustBrisk(t, "token", "create", "ci-f", "--scope", "deploy", "--function", "f.team-a", "-q")))
	if _, err := fc.Create(ctx, mustSpec(t, `{"name":"f","namespace":"team-b","builtin":"trace","secrets":["db"]}`)); !isStatus(err, 403) {
		t.Fatalf("a function-limited token creates f naming team-b's secret: %v, want 403", err)
	}
	if _, err := fc.Secrets(ctx, "team-a"); !isStatus(err, 403) {
		t.Fatalf("a function-limited token lists secrets: %v, want 403", err)
	}
	if _, err := fc.UpdateSecret(ctx, api.SecretRequest{Name: "db", Namespace: "team-a", Value: "attacker's database"}); !isStatus(err, 403) {
		t.Fatalf("a function-limited token replaces a secret: %v, want 403", err)
	}
	// Once a namespace-wide token gave f a secret, f's token may redeploy
	// it with that secret, or without, but not add another.
	if _, err := c.cl.Create(ctx, mustSpec(t, `{"name":"f","namespace":"team-a","builtin":"trace","secrets":["db"]}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := fc.Update(ctx, mustSpec(t, `{"name":"f","namespace":"team-a","builtin":"trace","env":{"V":"2"},"secrets":["db"]}`)); err != nil {
		t.Fatalf("f's token redeploys f with its secret: %v", err)
	}
	if _, err := fc.Update(ctx, mustSpec(t, `{"name":"f","namespace":"team-a","builtin":"trace","secrets":["db","api-key"]}`)); !isStatus(err, 403) {
		t.Fatalf("f's token adds a secret to f: %v, want 403", err)
	}
	if _, err := fc.Update(ctx, mustSpec(t, `{"name":"f","namespace":"team-a","builtin":"trace"}`)); err != nil {
		t.Fatalf("f's token drops f's secret: %v", err)
	}
	if _, err := fc.Update(ctx, mustSpec(t, `{"name":"f","namespace":"team-a","builtin":"trace","secrets":["db"]}`)); !isStatus(err, 403) {
		t.Fatalf("f's token gives f back a secret it dropped: %v, want 403", err)
	}
}

// A namespace holds a bounded number and size of secrets, whoever writes
// them: a tenant's token cannot fill the control plane's memory.
func TestSecretsNamespaceLimits(t *testing.T) {
	c, as := secretsCluster(t)
	ctx := context.Background()
	team := as(strings.TrimSpace(c.mustBrisk(t, "token", "create", "team-a", "--scope", "deploy", "--namespace", "team-a", "-q")))
	const maxCount, maxBytes = spec.MaxSecretsPerNamespace, spec.MaxSecretBytesPerNamespace
	for i := 2; i < maxCount; i++ { // db and api-key are there
		if _, err := team.CreateSecret(ctx, api.SecretRequest{Name: fmt.Sprintf("s-%d", i), Value: "v"}); err != nil {
			t.Fatalf("secret %d of team-a: %v", i+1, err)
		}
	}
	if _, err := team.CreateSecret(ctx, api.SecretRequest{Name: "one-too-many", Value: "v"}); !isStatus(err, 403) {
		t.Fatalf("secret %d of team-a: %v, want 403", maxCount+1, err)
	}
	big := make([]byte, spec.MaxSecretSize)
	used := int64(len("team-b's password"))
	for i := 0; used+int64(len(big)) <= maxBytes; i++ {
		if _, err := c.cl.CreateSecret(ctx, api.SecretRequest{Name: fmt.Sprintf("big-%d", i), Namespace: "team-b", RawValue: big}); err != nil {
			t.Fatalf("big secret %d of team-b: %v", i, err)
		}
		used += int64(len(big))
	}
	if _, err := c.cl.CreateSecret(ctx, api.SecretRequest{Name: "big-last", Namespace: "team-b", RawValue: big}); !isStatus(err, 403) {
		t.Fatalf("team-b's secrets past %d bytes: %v, want 403", maxBytes, err)
	}
	// db grown to 1 MiB fills team-b exactly; then not one more byte.
	if _, err := c.cl.UpdateSecret(ctx, api.SecretRequest{Name: "db", Namespace: "team-b", RawValue: big}); err != nil {
		t.Fatalf("an update filling team-b's secrets to the limit: %v", err)
	}
	if _, err := c.cl.CreateSecret(ctx, api.SecretRequest{Name: "tiny", Namespace: "team-b", Value: "v"}); !isStatus(err, 403) {
		t.Fatalf("a secret past team-b's full %d bytes: %v, want 403", maxBytes, err)
	}
	if _, err := c.cl.UpdateSecret(ctx, api.SecretRequest{Name: "big-0", Namespace: "team-b", RawValue: big[:10]}); err != nil {
		t.Fatalf("an update shrinking a secret of a full namespace: %v", err)
	}
	if _, err := c.cl.CreateSecret(ctx, api.SecretRequest{Name: "tiny", Namespace: "team-b", Value: "v"}); err != nil {
		t.Fatalf("a secret in the room a shrunk one left: %v", err)
	}
	if _, err := c.cl.UpdateSecret(ctx, api.SecretRequest{Name: "big-0", Namespace: "team-b", RawValue: big}); !isStatus(err, 403) {
		t.Fatalf("an update taking team-b's secrets past %d bytes: %v, want 403", maxBytes, err)
	}
	if secs, err := c.cl.Secrets(ctx, "team-b"); err != nil || len(secs) != 65 {
		t.Fatalf("team-b's secrets: %d, %v; want db, 63 big ones and tiny", len(secs), err)
	}
}

// A secret created in a namespace being deleted: one of the two fails.
// Were both to succeed, the secret would outlive its namespace, and a
// namespace made again under that name (another tenant's) would inherit
// it.
func TestSecretsNamespaceDeleteRace(t *testing.T) {
	c, _ := secretsCluster(t)
	ctx := context.Background()
	for i := range 20 {
		ns := fmt.Sprintf("tmp-%d", i)
		if _, err := c.cl.PutNamespace(ctx, ns, spec.Quota{}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var secErr, nsErr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, secErr = c.cl.CreateSecret(ctx, api.SecretRequest{Name: "s", Namespace: ns, Value: "v"})
		}()
		go func() { defer wg.Done(); nsErr = c.cl.DeleteNamespace(ctx, ns) }()
		wg.Wait()
		if secErr == nil && nsErr == nil {
			secs, _ := c.cl.Secrets(ctx, ns)
			t.Fatalf("namespace %s deleted while its secret was created: the secret outlives it (%+v)", ns, secs)
		}
	}
	// The same for a function (it would name the namespace's secrets).
	for i := range 20 {
		ns := fmt.Sprintf("fn-tmp-%d", i)
		if _, err := c.cl.PutNamespace(ctx, ns, spec.Quota{}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var fnErr, nsErr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, fnErr = c.cl.Create(ctx, mustSpec(t, `{"name":"`+ns+`","namespace":"`+ns+`","builtin":"trace"}`))
		}()
		go func() { defer wg.Done(); nsErr = c.cl.DeleteNamespace(ctx, ns) }()
		wg.Wait()
		if fnErr == nil && nsErr == nil {
			t.Fatalf("namespace %s deleted while a function was created in it: the function outlives it", ns)
		}
	}
}
