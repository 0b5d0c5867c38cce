//go:build !unix

package testutil

import "time"

// CPUTimes reports nothing where there is no getrusage: benchmarks show
// zero CPU per call there.
func CPUTimes() (self, children time.Duration) { return 0, 0 }
