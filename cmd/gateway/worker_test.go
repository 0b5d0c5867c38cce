package main

import (
	"math"
	"runtime/debug"
	"testing"
)

func TestTuneWorkerGC(t *testing.T) {
	tests := []struct {
		name, gogc, memlimit string
		tuned                bool
	}{
		{"runtime defaults", "", "", true},
		{"GOGC set", "150", "", false},
		{"GOMEMLIMIT set", "", "1GiB", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOGC", tc.gogc)
			t.Setenv("GOMEMLIMIT", tc.memlimit)
			percent := debug.SetGCPercent(100)
			limit := debug.SetMemoryLimit(math.MaxInt64)
			t.Cleanup(func() {
				debug.SetGCPercent(percent)
				debug.SetMemoryLimit(limit)
			})
			tuneWorkerGC()
			gotPercent := debug.SetGCPercent(100)
			gotLimit := debug.SetMemoryLimit(math.MaxInt64)
			if tc.tuned && (gotPercent != workerGCPercent || gotLimit != workerMemoryLimit) {
				t.Errorf("GC percent %d, memory limit %d; want %d and %d", gotPercent, gotLimit, workerGCPercent, workerMemoryLimit)
			}
			if !tc.tuned && (gotPercent != 100 || gotLimit != math.MaxInt64) {
				t.Errorf("GC percent %d, memory limit %d: the environment's settings were overridden", gotPercent, gotLimit)
			}
		})
	}
}
