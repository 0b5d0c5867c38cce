//go:build !unix

package host

import "log/slog"

// Plugins listen on TCP where there are no Unix sockets: nothing is left on
// disk.
type socketSweeper struct{}

func (*socketSweeper) sweep(*slog.Logger) {}
