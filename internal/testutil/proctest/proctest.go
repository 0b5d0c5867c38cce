// Package proctest sees processes through /proc, for tests that check that
// what a command, a plugin or a gateway started is gone. A zombie nobody
// has reaped yet counts as gone: it runs nothing.
package proctest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Process is a process as a test saw it. Start, its start time, tells it
// from a later process given the same PID; "" matches any.
type Process struct {
	PID   int
	Start string
}

// Seen returns the processes of pids with their start times now.
func Seen(pids ...int) []Process {
	out := make([]Process, len(pids))
	for i, pid := range pids {
		start, _ := stat(pid)
		out[i] = Process{PID: pid, Start: start}
	}
	return out
}

// Alive reports whether the process runs.
func (p Process) Alive() bool {
	start, state := stat(p.PID)
	return state != "" && state != "Z" && state != "X" && (p.Start == "" || start == p.Start)
}

// stat reads a process's start time and state; "" when there is no such
// process.
func stat(pid int) (start, state string) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", ""
	}
	// The command name, in parentheses, may hold spaces.
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	if len(fields) < 20 {
		return "", ""
	}
	return fields[19], fields[0]
}

// ReadPIDs reads the process IDs a script wrote to path, one a line; a
// line still being written is left for the next read, and a file not yet
// written holds none.
func ReadPIDs(path string) []int {
	data, _ := os.ReadFile(path)
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// WaitGone waits up to within for the processes to be gone, and fails t
// for each that is not, killing it so that it outlives no test.
func WaitGone(t testing.TB, within time.Duration, procs []Process) {
	t.Helper()
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if !anyAlive(procs) {
			return
		}
	}
	for _, p := range procs {
		if p.Alive() {
			t.Errorf("process %d is still running %v later", p.PID, within)
			if proc, err := os.FindProcess(p.PID); err == nil {
				_ = proc.Kill()
			}
		}
	}
}

func anyAlive(procs []Process) bool {
	for _, p := range procs {
		if p.Alive() {
			return true
		}
	}
	return false
}
