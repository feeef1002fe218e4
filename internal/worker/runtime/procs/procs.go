package procs

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// Stat reads a process's state letter and start time (field 22 of
// /proc/<pid>/stat, in clock ticks after boot). The pair (pid, start time)
// names one process for the life of the machine, which a pid alone does not
// once pids wrap.
func Stat(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// Field 2, the command name, is in parentheses and may itself contain
	// spaces and parentheses: the fields we want follow the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no ')' in %q", pid, b)
	}
	f := bytes.Fields(b[i+1:])
	const stateField, startField = 3, 22 // 1-based, as in proc(5)
	if len(f) <= startField-stateField {
		return 0, 0, fmt.Errorf("/proc/%d/stat: only %d fields after the name", pid, len(f))
	}
	start, err = strconv.ParseUint(string(f[startField-stateField]), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: start time: %w", pid, err)
	}
	return f[0][0], start, nil
}

// Parent reads a process's parent pid (field 4 of /proc/<pid>/stat).
func Parent(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no ')' in %q", pid, b)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: only %d fields after the name", pid, len(f))
	}
	return strconv.Atoi(string(f[1]))
}

// Alive reports whether the process started at start still runs as pid.
// A zombie is not alive: its program has ended and only its parent's wait
// is missing, which for an orphan may never come.
func Alive(pid int, start uint64) bool {
	state, got, err := Stat(pid)
	return err == nil && got == start && state != 'Z' && state != 'X'
}

// RSS is a process's resident memory in bytes (the second field of
// /proc/<pid>/statm, in pages).
func RSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return 0, err
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/statm: %q", pid, b)
	}
	pages, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/statm: %w", pid, err)
	}
	return pages * int64(os.Getpagesize()), nil
}
