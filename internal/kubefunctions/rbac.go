package kubefunctions

import (
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Rules are all the controller may do: read and watch Function objects,
// update them (its finalizer) and their status. Nothing else: it deploys
// through brisk's admin API, not through Kubernetes.
func Rules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{Group}, Resources: []string{Resource}, Verbs: []string{"get", "list", "watch", "update"}},
		{APIGroups: []string{Group}, Resources: []string{Resource + "/status"}, Verbs: []string{"update"}},
	}
}

// ClusterRole is Rules for a controller watching every namespace (bind it
// with a ClusterRoleBinding).
func ClusterRole(name string) *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: Rules()}
}

// Role is Rules for a controller watching one namespace (--namespace).
func Role(namespace, name string) *rbacv1.Role {
	return &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Rules: Rules()}
}
