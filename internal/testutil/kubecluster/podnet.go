package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// What the kubelet's Pods reach on this host, at the bridge's address (the
// only one of the host on their network: they have no default route). No
// kube-proxy runs, so ClusterIP Services lead nowhere; Pods find the
// apiserver at KubeletAPIServer and names through ClusterDNS.
const (
	// KubeletGatewayIP is the bridge's (the host's) address on the pod
	// network.
	KubeletGatewayIP = "10.216.0.1"
	// ClusterDomain is the kubelet's cluster domain.
	ClusterDomain = "cluster.local"
)

// apiProxy forwards TCP connections from the pod network to the apiserver
// on loopback: the apiserver binds 127.0.0.1 only, and Pods cannot reach
// loopback. Its serving certificate names KubeletGatewayIP too.
type apiProxy struct {
	l     net.Listener
	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func startAPIProxy(target string) (*apiProxy, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(KubeletGatewayIP, "0"))
	if err != nil {
		return nil, err
	}
	p := &apiProxy{l: l, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return // closed
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.forward(c, target)
			}()
		}
	}()
	return p, nil
}

func (p *apiProxy) track(c net.Conn, on bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil { // closed
		return false
	}
	if on {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
	return true
}

func (p *apiProxy) forward(c net.Conn, target string) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	if !p.track(c, true) || !p.track(up, true) {
		return
	}
	defer p.track(c, false)
	defer p.track(up, false)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done // either side closing ends both
}

// close stops accepting, ends the open connections and waits for their
// goroutines.
func (p *apiProxy) close() {
	_ = p.l.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// APIServer is the apiserver's address for the kubelet's Pods,
// host:port on KubeletGatewayIP: give it to Pods as
// KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT (the kubernetes
// Service's ClusterIP, which client-go's in-cluster config would use,
// needs a kube-proxy).
func (k *Kubelet) APIServer() string { return k.api.l.Addr().String() }

// StartDNS starts CoreDNS (scripts/k8s-binaries.sh builds it) on
// KubeletGatewayIP:53, the kubelet's cluster DNS, answering for
// ClusterDomain from the cluster's Services and EndpointSlices (its
// kubernetes plugin reads the apiserver as the admin). Nothing else is
// answered and nothing is forwarded: Pods resolve cluster names only.
// EndpointSlices need the controller manager's endpointslice-controller
// (StartControllers). It returns when CoreDNS answers for the cluster
// domain and stops with the kubelet. Without the binary the test is
// skipped, or failed under CI.
func (k *Kubelet) StartDNS(t testing.TB) {
	t.Helper()
	bin := filepath.Join(k.c.bin, "coredns")
	if fi, err := os.Stat(bin); err != nil || fi.Mode()&0o111 == 0 {
		msg := "kubecluster: cluster DNS needs " + bin + " (scripts/k8s-binaries.sh)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg + "; CI must run these tests")
		}
		t.Skip(msg)
	}
	// The kubeconfig's context is the one writeKubeconfig names.
	corefile := fmt.Sprintf(`%s:53 {
	bind %s
	errors
	kubernetes %s {
		kubeconfig %s brisk-test
	}
}
`, ClusterDomain, KubeletGatewayIP, ClusterDomain, k.c.Kubeconfig)
	path := filepath.Join(k.Dir, "Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o600); err != nil {
		t.Fatalf("kubecluster: %v", err)
	}
	k.start(t, "coredns", bin, "-conf", path)
	// Ready when it answers for the apiserver's own Service (which the
	// apiserver always has): its caches have synced.
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort(KubeletGatewayIP, "53"))
	}}
	var last error = errors.New("not asked yet")
	for {
		if err := k.exited(); err != nil {
			t.Fatalf("kubecluster: %v", err)
		}
		actx, acancel := context.WithTimeout(ctx, time.Second)
		addrs, err := r.LookupHost(actx, "kubernetes.default.svc."+ClusterDomain+".")
		acancel()
		if err == nil && len(addrs) > 0 {
			return
		}
		last = err
		if ctx.Err() != nil {
			t.Fatalf("kubecluster: CoreDNS did not answer for %s after %v: %v; its log ends:\n%s", ClusterDomain, startTimeout, last,
				tail(filepath.Join(k.Dir, "coredns.log"), 20))
		}
		time.Sleep(pollEvery)
	}
}

// apiTarget is the apiserver's host:port from its URL.
func apiTarget(host string) (string, error) {
	u, err := url.Parse(host)
	if err != nil || !strings.HasPrefix(u.Scheme, "http") {
		return "", fmt.Errorf("apiserver URL %q: %v", host, err)
	}
	return u.Host, nil
}
