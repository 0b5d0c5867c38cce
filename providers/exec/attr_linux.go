package exec

import "syscall"

// supervisorAttr puts the supervisor in a group of its own and has it told
// (TERM) when the process that started it dies, however that dies.
func supervisorAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// commandAttr puts the command in a group of its own, which the supervisor
// signals as a whole; the command dies with the supervisor, should that be
// killed outright.
func commandAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
