package containerd

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/typeurl/v2"
)

const cgroupRoot = "/sys/fs/cgroup"

// cgroupV2 reports whether the host runs the unified hierarchy only, which
// is where runc puts containers then; on hybrid hosts it uses v1.
func cgroupV2() bool {
	_, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers"))
	return err == nil
}

// oomKills reads the kernel's OOM-kill counter of the memory cgroup at path
// (the OCI cgroupsPath): v2 memory.events, v1 memory.oom_control. It is 0
// when the cgroup or the counter is missing.
func oomKills(v2 bool, path string) int64 {
	file := filepath.Join(cgroupRoot, "memory", path, "memory.oom_control")
	if v2 {
		file = filepath.Join(cgroupRoot, path, "memory.events")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == "oom_kill" {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// watchOOM records the containers containerd reports an OOM event for
// (the shim watches each task's memory cgroup), until ctx ends. The event
// can come after the task's exit; a SIGKILLed task's cgroup counter covers
// that case (see describeExit).
func (r *Runtime) watchOOM(ctx context.Context) {
	evc, errc := r.client.Subscribe(ctx, `topic=="/tasks/oom"`, `namespace==`+strconv.Quote(r.cfg.Namespace))
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-errc:
			if ctx.Err() == nil {
				r.log.Warn("containerd event stream ended; OOM kills are told from exit codes only", "err", err)
			}
			return
		case env := <-evc:
			v, err := typeurl.UnmarshalAny(env.Event)
			if err != nil {
				continue
			}
			if e, ok := v.(*apievents.TaskOOM); ok {
				r.mu.Lock()
				if sb := r.sandboxes[e.ContainerID]; sb != nil {
					sb.oom.Store(true)
				}
				r.mu.Unlock()
			}
		}
	}
}
