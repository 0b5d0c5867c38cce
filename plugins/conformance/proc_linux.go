package conformance

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// processGone reports whether pid has exited; a zombie awaiting its reaper
// counts as gone.
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name, which is in parentheses and may
	// itself hold spaces or parentheses.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) == 0 || fields[0] == "Z" || fields[0] == "X"
}
