package gcfloor

import (
	"os"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	tests := []struct {
		live, room uint64
		want       int
	}{
		{5 << 20, 32 << 20, 640},
		{32 << 20, 32 << 20, 100},
		{300 << 20, 32 << 20, 100},
		{16 << 20, 32 << 20, 200},
		{1 << 10, 32 << 20, maxPercent},
		{0, 32 << 20, maxPercent},
	}
	for _, tc := range tests {
		if got := Percent(tc.live, tc.room); got != tc.want {
			t.Errorf("Percent(%d, %d) = %d, want %d", tc.live, tc.room, got, tc.want)
		}
	}
}

func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestStartRaisesTheTarget checks that, on a small heap, the collector's
// GOGC is raised once a collection has run, and an operator's GOGC or
// GOMEMLIMIT is left alone.
func TestStartRaisesTheTarget(t *testing.T) {
	for _, v := range []string{"GOGC", "GOMEMLIMIT"} {
		t.Run(v+" set", func(t *testing.T) {
			t.Setenv(v, "100")
			before := gogc()
			Start(256 << 20)
			runtime.GC()
			runtime.GC()
			if p := gogc(); p != before {
				t.Fatalf("with %s in the environment, GOGC went from %d to %d", v, before, p)
			}
		})
	}
	t.Run("GOGC unset", func(t *testing.T) {
		for _, v := range []string{"GOGC", "GOMEMLIMIT"} {
			t.Setenv(v, "")
			os.Unsetenv(v)
		}
		Start(256 << 20)
		deadline := time.Now().Add(30 * time.Second)
		for gogc() <= 100 {
			if time.Now().After(deadline) {
				t.Fatalf("GOGC still %d after collections", gogc())
			}
			runtime.GC()
			time.Sleep(10 * time.Millisecond)
		}
	})
}
