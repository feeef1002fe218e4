package fncontroller

import (
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Rules are all the controller may do: read and watch Function objects,
// update them (its finalizer) and their status, and read and watch
// Namespaces (which are opted in, LabelNamespaceEnabled). Nothing else: it
// deploys through brisk's admin API, not through Kubernetes.
func Rules() []rbacv1.PolicyRule {
	return append(functionRules(), namespaceRule(""))
}

func functionRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{Group}, Resources: []string{Resource}, Verbs: []string{"get", "list", "watch", "update"}},
		{APIGroups: []string{Group}, Resources: []string{Resource + "/status"}, Verbs: []string{"update"}},
	}
}

// namespaceRule reads and watches namespace ns ("": all).
func namespaceRule(ns string) rbacv1.PolicyRule {
	r := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}}
	if ns != "" {
		r.ResourceNames = []string{ns}
	}
	return r
}

// ClusterRole is Rules for a controller watching every namespace (bind it
// with a ClusterRoleBinding).
func ClusterRole(name string) *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: Rules()}
}

// Role is the Function rules for a controller watching one namespace
// (--namespace). Namespaces are cluster-scoped: it needs NamespaceReader
// too, bound with a ClusterRoleBinding.
func Role(namespace, name string) *rbacv1.Role {
	return &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Rules: functionRules()}
}

// NamespaceReader is the ClusterRole that lets a controller watching one
// namespace (Role) read and watch that Namespace object, and no other.
func NamespaceReader(namespace, name string) *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{namespaceRule(namespace)}}
}
