package host

import "github.com/chaingate/gateway/providers"

// PID returns the pid of the running process behind a handle from
// Manager.Provider, or 0 when none is running.
func PID(p providers.Provider) int {
	h := p.(*handle)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur == nil {
		return 0
	}
	return h.cur.cmd.Process.Pid
}

// UnaryOnly makes m call plugins with one gRPC call per Execute, as it does
// for plugins that do not serve Session.
func UnaryOnly(m *Manager) { m.unary = true }
