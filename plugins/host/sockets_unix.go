//go:build unix

package host

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/chaingate/gateway/plugins/internal/wire"
)

// staleSocketDir is how old a socket directory left by a gateway that is
// gone must be before it is removed, and how often launches look for such
// directories. A gateway in another pid namespace sharing the temporary
// directory may look gone from here; it uses its directories only in the
// seconds a plugin takes to start.
const staleSocketDir = time.Minute

// processStart tells this process's socket directories from those of an
// earlier one that had the same pid, as a container's gateway, always pid
// 1, has after a restart.
var processStart = time.Now()

// socketSweeper removes, at most once a staleSocketDir, the socket
// directories (see wire.MakeSocketDir) of gateways that are gone: a gateway
// killed with SIGKILL removes none of its own, and the kernel kills its
// plugins before they can. Launches call it; one restarted within the
// minute finds its predecessor's last directories at a later launch.
type socketSweeper struct {
	mu   sync.Mutex
	last time.Time
}

func (s *socketSweeper) sweep(log *slog.Logger) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.last.IsZero() && time.Since(s.last) < staleSocketDir {
		return
	}
	s.last = time.Now()
	base := os.TempDir()
	entries, err := os.ReadDir(base)
	if err != nil {
		log.Warn("listing the temporary directory for plugin sockets left behind", "dir", base, "err", err)
		return
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), wire.SocketDirPrefix) || !e.IsDir() {
			continue
		}
		info, err := e.Info()
		if err != nil || !stale(e.Name(), info) {
			continue
		}
		dir := filepath.Join(base, e.Name())
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("removing a plugin socket directory left behind", "dir", dir, "err", err)
		}
	}
}

// stale reports whether a socket directory was left by a gateway that is
// gone. Another user's are never this gateway's to remove.
func stale(name string, info os.FileInfo) bool {
	if st, ok := info.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Getuid() {
		return false
	}
	if time.Since(info.ModTime()) < staleSocketDir {
		return false
	}
	digits, _, _ := strings.Cut(strings.TrimPrefix(name, wire.SocketDirPrefix), "-")
	pid, err := strconv.Atoi(digits)
	switch {
	case err != nil || pid <= 0:
		return false
	case pid == os.Getpid():
		return info.ModTime().Before(processStart)
	default:
		return !processAlive(pid)
	}
}

// processAlive reports whether pid names a process, one this user may not
// signal included.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
