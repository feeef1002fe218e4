// Package testutil holds the helpers brisk's tests share: polling instead of
// sleeping, labelling root-only tests, and picking loopback ports.
package testutil
