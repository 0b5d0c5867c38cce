//go:build unix && !linux

package exec

import "syscall"

// supervisorAttr puts the supervisor in a group of its own. Outside Linux
// no signal tells it that the process that started it died.
func supervisorAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// commandAttr puts the command in a group of its own, which the supervisor
// signals as a whole.
func commandAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// groupRuns reports whether a process of the group is left; init reaps
// what dies orphaned, so no zombie stays in the group for long.
func groupRuns(pgid int) bool { return syscall.Kill(-pgid, 0) == nil }
