// Package testutil holds what the project's tests share across packages.
package testutil

import (
	"bytes"
	"os"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent writers, such as a logger
// or a child process's output, read while they write.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// QuickRaceExit keeps plugin processes that are the test binary itself
// from lingering a second at every exit under -race, unless GORACE says
// otherwise.
func QuickRaceExit() {
	if _, ok := os.LookupEnv("GORACE"); !ok {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
}
