package host

import (
	"os/exec"
	"syscall"
)

// setDeathSignal has the kernel kill the plugin if the gateway dies without
// cleaning up, for plugins that do not watch their parent as Serve does.
func setDeathSignal(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
