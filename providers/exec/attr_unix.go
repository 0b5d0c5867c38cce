//go:build unix && !linux

package exec

import "syscall"

// supervisorAttr puts the supervisor in a group of its own. Outside Linux
// no signal tells it that the process that started it died.
func supervisorAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// commandAttr puts the command in a group of its own, which the supervisor
// signals as a whole.
func commandAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
