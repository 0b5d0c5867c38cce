//go:build unix

package wire

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-plugin"
)

// SocketDirPrefix begins the name of a plugin's socket directory. A plugin
// listens on a Unix socket that go-plugin creates in the directory named
// by plugin.EnvUnixSocketDir. Whoever launches a plugin gives each launch a
// directory of its own, named after the launcher's pid, and removes it
// once the process has exited: a plugin that crashed, or that the kernel
// killed along with its gateway, leaves its socket behind otherwise, one
// file in the temporary directory per crash. The name is short because a
// socket's whole path must fit in 104 bytes on some systems.
const SocketDirPrefix = "cgp-"

// MakeSocketDir makes the directory for one launch's socket, to name to
// the plugin with SocketDirEnv.
func MakeSocketDir() (string, error) {
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", SocketDirPrefix, os.Getpid()))
	if err != nil {
		return "", fmt.Errorf("making the plugin's socket directory: %w", err)
	}
	return dir, nil
}

// removeOwnSocketDir removes the socket directory a launcher made for this
// plugin, for a plugin that exits because its launcher is gone. A directory
// named by anyone else is left alone.
func removeOwnSocketDir() {
	dir := os.Getenv(plugin.EnvUnixSocketDir)
	if dir != "" && strings.HasPrefix(filepath.Base(dir), SocketDirPrefix) {
		_ = os.RemoveAll(dir)
	}
}
