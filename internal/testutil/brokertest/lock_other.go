//go:build !unix

package brokertest

import (
	"os"
	"time"
)

// flock does nothing where there is no flock(2): test processes sharing the
// broker there must not restart it.
func flock(*os.File, bool, time.Duration) error { return nil }
