package install

import (
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/brisk-faas/brisk/internal/auth"
	"github.com/brisk-faas/brisk/internal/pki"
	"github.com/brisk-faas/brisk/pkg/api"
)

// The Secrets Install makes, and their keys. The control plane's holds
// the CA's key and the admin, join and deploy tokens (the Function
// controller mounts the CA certificate and the deploy token of it); the
// workers and data planes mount only the other, which holds what they
// join with.
const (
	SecretControlPlane = "brisk-controlplane"
	SecretJoin         = "brisk-join"
	KeyCACert          = pki.CACertFile     // ca.crt
	KeyCAKey           = pki.CAKeyFile      // ca.key
	KeyAdminToken      = api.AdminTokenFile // admin.token
	KeyJoinToken       = pki.JoinTokenFile  // join.token
	KeyDeployToken     = "deploy.token"
)

// newControlPlaneSecret makes a cluster CA and a first admin, join and
// deploy token, the control plane's Secret.
func newControlPlaneSecret(ns string) (*corev1.Secret, error) {
	dir, err := os.MkdirTemp("", "brisk-ca-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if _, err := pki.CreateCA(dir); err != nil {
		return nil, fmt.Errorf("cluster CA: %w", err)
	}
	data := map[string][]byte{}
	for _, f := range []string{KeyCACert, KeyCAKey} {
		if data[f], err = os.ReadFile(filepath.Join(dir, f)); err != nil {
			return nil, err
		}
	}
	admin, _, err := auth.New([]string{auth.ScopeAdmin}, nil, "")
	if err != nil {
		return nil, err
	}
	join, _, err := auth.New([]string{auth.ScopeJoin}, nil, "")
	if err != nil {
		return nil, err
	}
	deploy, _, err := auth.New([]string{auth.ScopeDeploy}, nil, "")
	if err != nil {
		return nil, err
	}
	data[KeyAdminToken], data[KeyJoinToken], data[KeyDeployToken] = []byte(admin+"\n"), []byte(join+"\n"), []byte(deploy+"\n")
	return &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: SecretControlPlane, Namespace: ns, Labels: managedLabels()},
		Type:       corev1.SecretTypeOpaque,
		Data:       data,
	}, nil
}

// joinSecret is the workers' and data planes' Secret, taken from the
// control plane's.
func joinSecret(cp *corev1.Secret) (*corev1.Secret, error) {
	for _, k := range []string{KeyCACert, KeyCAKey, KeyAdminToken, KeyJoinToken} {
		if len(cp.Data[k]) == 0 {
			return nil, fmt.Errorf("secret %s/%s has no %s: delete it to have install make a new cluster CA and tokens (the cluster's certificates and tokens then change)", cp.Namespace, cp.Name, k)
		}
	}
	return &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: SecretJoin, Namespace: cp.Namespace, Labels: managedLabels()},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{KeyCACert: cp.Data[KeyCACert], KeyJoinToken: cp.Data[KeyJoinToken]},
	}, nil
}

// useAdminToken gives the Function controller of pod spec p the admin
// token instead of its deploy token: to create brisk namespaces (an
// admin's act), or in a Secret made before install made deploy tokens,
// whose control plane will not register one now (its registry is in use).
func useAdminToken(p *corev1.PodSpec) {
	for _, v := range p.Volumes {
		if s := v.Secret; s != nil {
			for i := range s.Items {
				if s.Items[i].Key == KeyDeployToken {
					s.Items[i] = corev1.KeyToPath{Key: KeyAdminToken, Path: KeyAdminToken}
				}
			}
		}
	}
	for i := range p.Containers {
		for j, a := range p.Containers[i].Args {
			if a == "--token-file=/etc/brisk/"+KeyDeployToken {
				p.Containers[i].Args[j] = "--token-file=/etc/brisk/" + KeyAdminToken
			}
		}
	}
}

func managedLabels() map[string]string {
	return map[string]string{"app.kubernetes.io/part-of": "brisk", LabelManagedBy: ManagedBy}
}
