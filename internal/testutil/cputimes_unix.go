//go:build unix

package testutil

import (
	"syscall"
	"time"
)

// CPUTimes returns the user+system CPU time of this process and of its
// children that have exited and been waited for.
func CPUTimes() (self, children time.Duration) {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru)
	children = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return self, children
}
