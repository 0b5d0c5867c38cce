package exec

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// supervisorAttr puts the supervisor in a group of its own and has it told
// (TERM) when the process that started it dies, however that dies.
func supervisorAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// commandAttr puts the command in a group of its own, which the supervisor
// signals as a whole; the command dies with the supervisor, should that be
// killed outright.
func commandAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// groupRuns reports whether a process of the group runs. A zombie does
// not: where PID 1 reaps no orphans, one stays in the group for good.
func groupRuns(pgid int) bool {
	if syscall.Kill(-pgid, 0) != nil {
		return false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	want := strconv.Itoa(pgid)
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// The command name, in parentheses, may hold anything.
		fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
		if len(fields) > 2 && fields[2] == want && fields[0] != "Z" && fields[0] != "X" {
			return true
		}
	}
	return false
}
