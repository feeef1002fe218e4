package cli

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/brisk-faas/brisk/internal/kubernetes/install"
	"github.com/brisk-faas/brisk/internal/testutil/kubecluster"
)

// TestK8sManifestArgs parses every container's arguments in the rendered
// manifests with brisk's own commands, as the Pods will run them: a
// renamed or misspelt flag fails here, not in a crash-looping Pod.
func TestK8sManifestArgs(t *testing.T) {
	envRef := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	for _, rt := range install.WorkerRuntimes {
		objs, err := install.Render(install.Options{WorkerRuntime: rt})
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for _, u := range objs {
			var pod corev1.PodSpec
			switch u.GetKind() {
			case "StatefulSet":
				var s appsv1.StatefulSet
				mustConvert(t, u.Object, &s)
				pod = s.Spec.Template.Spec
			case "Deployment":
				var d appsv1.Deployment
				mustConvert(t, u.Object, &d)
				pod = d.Spec.Template.Spec
			case "DaemonSet":
				var d appsv1.DaemonSet
				mustConvert(t, u.Object, &d)
				pod = d.Spec.Template.Spec
			default:
				continue
			}
			for _, c := range pod.Containers {
				env := map[string]string{}
				for _, e := range c.Env {
					if e.ValueFrom != nil {
						env[e.Name] = "x-" + strings.ToLower(e.Name) // a Pod's field, a name or an address
					} else {
						env[e.Name] = envRef.ReplaceAllStringFunc(e.Value, func(m string) string { return env[envRef.FindStringSubmatch(m)[1]] })
					}
				}
				env["HOST_IP"], env["POD_IP"] = "10.0.0.7", "10.1.0.7"
				args := make([]string, len(c.Args))
				for i, a := range c.Args {
					args[i] = envRef.ReplaceAllStringFunc(a, func(m string) string {
						v, ok := env[envRef.FindStringSubmatch(m)[1]]
						if !ok {
							t.Errorf("%s %s: %s refers to no env var", u.GetKind(), u.GetName(), m)
						}
						return v
					})
				}
				cmd, rest, err := newRoot().Find(args)
				var words []string // the command's path: args up to the first flag
				for _, a := range args {
					if strings.HasPrefix(a, "-") {
						break
					}
					words = append(words, a)
				}
				if err != nil || cmd.CommandPath() != "brisk "+strings.Join(words, " ") {
					t.Fatalf("%s %s: %v finds no brisk command: %v", u.GetKind(), u.GetName(), args, err)
				}
				if err := cmd.ParseFlags(rest); err != nil {
					t.Errorf("%s %s (%s worker): brisk %s: %v", u.GetKind(), u.GetName(), rt, strings.Join(args, " "), err)
				}
				if cmd.Flags().NArg() != 0 {
					t.Errorf("%s %s: stray arguments %v", u.GetKind(), u.GetName(), cmd.Flags().Args())
				}
				seen++
			}
		}
		if seen != 4 {
			t.Errorf("%s worker: %d containers checked, want 4 (control plane, data plane, worker, Function controller)", rt, seen)
		}
	}
}

func mustConvert(t *testing.T, m map[string]any, v any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, v); err != nil {
		t.Fatal(err)
	}
}

func TestK8sManifestsCommand(t *testing.T) {
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"k8s", "manifests", "-n", "other", "--replicas", "5", "--worker-runtime", "kube"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"kind: StatefulSet", "replicas: 5", "namespace: other", "--runtime=kube", "kind: Role\n", "brisk-controlplane-4=",
		"name: other-sandboxes", "--kube-namespace=other-sandboxes", "--create-namespaces=false", "pod-security.kubernetes.io/enforce: baseline"} {
		if !strings.Contains(s, want) {
			t.Errorf("manifests lack %q", want)
		}
	}
	root = newRoot()
	root.SetArgs([]string{"k8s", "manifests", "--replicas", "4"})
	root.SetOut(&out)
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "want 1, 3, 5 or 7") {
		t.Errorf("--replicas 4: %v", err)
	}
}

// TestK8sInstallCommand runs brisk k8s install, again, and uninstall
// against a real kube-apiserver through a kubeconfig file.
func TestK8sInstallCommand(t *testing.T) {
	c := kubecluster.Start(t, kubecluster.Options{})
	run := func(args ...string) string {
		t.Helper()
		root := newRoot()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(append(args, "--kubeconfig", c.Kubeconfig, "-n", "cli-test"))
		if err := root.Execute(); err != nil {
			t.Fatalf("brisk %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
	out := run("k8s", "install", "--ephemeral-storage", "--worker-runtime", "kube")
	for _, want := range []string{"StatefulSet cli-test/brisk-controlplane created", "Secret cli-test/brisk-controlplane created", "Role cli-test-sandboxes/brisk-worker created", "Namespace cli-test-sandboxes created"} {
		if !strings.Contains(out, want) {
			t.Errorf("install says\n%s\nwithout %q", out, want)
		}
	}
	out = run("k8s", "install", "--ephemeral-storage", "--worker-runtime", "kube")
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasSuffix(line, " unchanged") && !strings.HasPrefix(line, "brisk is installed") {
			t.Errorf("second install: %s", line)
		}
	}
	out = run("k8s", "uninstall")
	for _, want := range []string{"StatefulSet cli-test/brisk-controlplane deleted", "Secret cli-test/brisk-controlplane deleted", "Role cli-test-sandboxes/brisk-worker deleted", "Namespace cli-test deleted", "Namespace cli-test-sandboxes deleted", "CustomResourceDefinition functions.brisk.dev kept"} {
		if !strings.Contains(out, want) {
			t.Errorf("uninstall says\n%s\nwithout %q", out, want)
		}
	}
}
