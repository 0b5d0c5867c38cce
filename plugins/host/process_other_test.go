//go:build !linux

package host_test

import (
	"os"
	"syscall"
)

func runHostModeIfRequested() {}

func processGone(pid int) bool {
	p, err := os.FindProcess(pid)
	return err != nil || p.Signal(syscall.Signal(0)) != nil
}
