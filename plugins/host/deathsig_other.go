//go:build !linux

package host

import "os/exec"

// setDeathSignal does nothing where there is no parent-death signal; plugins
// served with Serve still exit when they notice their parent is gone.
func setDeathSignal(*exec.Cmd) {}
