//go:build !linux

package conformance

import (
	"os"
	"os/exec"
	"syscall"
)

// setParentDeathSignal does nothing where there is no parent-death signal.
func setParentDeathSignal(*exec.Cmd) {}

func processGone(pid int) bool {
	p, err := os.FindProcess(pid)
	return err != nil || p.Signal(syscall.Signal(0)) != nil
}
