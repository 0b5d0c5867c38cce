package host

import (
	"github.com/chaingate/gateway/plugins/proto/providerv1"
)

// Conn is a direct gRPC connection to one plugin process, launched exactly
// as a Manager launches it, for tools that check the wire contract itself
// ("gateway plugin check"). The gateway calls plugins through a Manager.
type Conn struct {
	// RPC is the plugin's service; Session streams opened on it are the
	// caller's own.
	RPC  providerv1.ProviderClient
	inst *instance
}

// Dial launches spec's plugin and completes the handshake and a first
// Describe, as the gateway does before a plugin's first call.
func Dial(spec Spec, opts Options) (*Conn, error) {
	m := NewManager(opts)
	m.unary = true // the caller opens its own sessions
	inst, err := m.start(spec)
	if err != nil {
		return nil, err
	}
	return &Conn{RPC: inst.rpc, inst: inst}, nil
}

// PID is the plugin process's id.
func (c *Conn) PID() int { return c.inst.cmd.Process.Pid }

// Exited is closed once the plugin process has exited.
func (c *Conn) Exited() <-chan struct{} { return c.inst.exited }

// ExitStatus describes how the process ended, or says it is running.
func (c *Conn) ExitStatus() string {
	if !c.inst.hasExited() {
		return "still running"
	}
	return c.inst.cmd.ProcessState.String()
}

// Close stops the plugin process, gracefully for a while, and waits for it.
func (c *Conn) Close() { c.inst.kill() }
