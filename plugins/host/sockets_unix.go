//go:build unix

package host

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/chaingate/gateway/plugins/internal/wire"
)

// staleSocketDir is how old a socket directory left by a gateway that is
// gone must be before it is removed. A gateway in another pid namespace
// sharing the temporary directory may look gone from here; it uses its
// directories only in the seconds a plugin takes to start.
const staleSocketDir = time.Minute

// sweepSocketDirs removes the socket directories (see wire.MakeSocketDir)
// of gateways that are gone: a gateway killed with SIGKILL removes none of
// its own, and the kernel kills its plugins before they can.
func sweepSocketDirs(log *slog.Logger) {
	base := os.TempDir()
	entries, err := os.ReadDir(base)
	if err != nil {
		log.Warn("listing the temporary directory for plugin sockets left behind", "dir", base, "err", err)
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), wire.SocketDirPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		digits, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(digits)
		if err != nil || pid <= 0 || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < staleSocketDir {
			continue
		}
		dir := filepath.Join(base, e.Name())
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("removing a plugin socket directory left behind", "dir", dir, "err", err)
		}
	}
}

// processAlive reports whether pid names a process, one this user may not
// signal included.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
