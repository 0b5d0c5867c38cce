//go:build unix

package brokertest

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// flock takes a shared or exclusive lock on f, which closing f releases.
// It polls, as flock(2) cannot time out.
func flock(f *os.File, exclusive bool, timeout time.Duration) error {
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still held by another test after %v", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
