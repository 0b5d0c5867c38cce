//go:build !unix

package wire

// Plugins listen on TCP where there are no Unix sockets: nothing is left on
// disk.
func MakeSocketDir() (string, error) { return "", nil }

func removeOwnSocketDir() {}
