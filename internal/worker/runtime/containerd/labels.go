package containerd

import (
	"net/netip"
	"strconv"

	"github.com/brisk-faas/brisk/internal/worker/netpool"
)

// Labels on every container (and its rootfs snapshot) this runtime creates.
// They mark it as brisk's and carry everything a later Runtime needs to
// report, adopt or tear it down.
const (
	LabelSandbox   = "brisk.sandbox"  // sandbox id
	LabelFunction  = "brisk.function" // function name
	LabelRevision  = "brisk.revision" // function revision
	LabelNetNS     = "brisk.netns"    // network pool endpoint name
	LabelState     = "brisk.state"    // owning Runtime's StateDir: separates workers sharing a containerd
	labelNetNSPath = "brisk.netns.path"
	labelIP        = "brisk.ip"
	labelGateway   = "brisk.gateway"
	labelHostVeth  = "brisk.veth"
	labelPort      = "brisk.port"
)

func endpointLabels(ep *netpool.Endpoint, l map[string]string) {
	l[LabelNetNS] = ep.Name
	l[labelNetNSPath] = ep.NetNS
	l[labelIP] = ep.IP.String()
	l[labelGateway] = ep.Gateway.String()
	l[labelHostVeth] = ep.HostVeth
}

// endpointFromLabels rebuilds the endpoint a container was created in.
func endpointFromLabels(l map[string]string) *netpool.Endpoint {
	ep := &netpool.Endpoint{Name: l[LabelNetNS], NetNS: l[labelNetNSPath], HostVeth: l[labelHostVeth]}
	ep.IP, _ = netip.ParseAddr(l[labelIP])
	ep.Gateway, _ = netip.ParseAddr(l[labelGateway])
	return ep
}

func addrFromLabels(l map[string]string) string {
	ip, err := netip.ParseAddr(l[labelIP])
	port, perr := strconv.Atoi(l[labelPort])
	if err != nil || perr != nil {
		return ""
	}
	return netip.AddrPortFrom(ip, uint16(port)).String()
}
