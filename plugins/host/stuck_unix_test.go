//go:build unix

package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chaingate/gateway/plugins/host"
	"github.com/chaingate/gateway/providers"
)

// TestStoppedPluginCallsEndOnTime stops the plugin process, so it reads
// nothing more, and sends it more than the connection buffers: every call
// still ends with its own deadline or cancellation, and the process is
// replaced for the calls after.
func TestStoppedPluginCallsEndOnTime(t *testing.T) {
	m, _ := newManager(t, host.Options{})
	p := m.Provider(host.Spec{Name: "echo", Builtin: "echo"})
	mustCall(t, p, `1`)
	pid := host.PID(p)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })

	big := json.RawMessage(`"` + strings.Repeat("x", 4<<20) + `"`)
	const deadline = 300 * time.Millisecond
	calls := []struct {
		name    string
		payload json.RawMessage
		cancel  bool // cancelled at the deadline instead of reaching it
		want    error
	}{
		{"big, stuck sending", big, false, context.DeadlineExceeded},
		{"small, queued behind", json.RawMessage(`2`), false, context.DeadlineExceeded},
		{"big, cancelled", big, true, context.Canceled},
	}
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 20 * time.Millisecond) // in this order
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			req := providers.Request{Payload: c.payload}
			if c.cancel {
				time.AfterFunc(deadline, cancel)
			} else {
				req.Deadline = time.Now().Add(deadline)
			}
			start := time.Now()
			_, err := p.Execute(ctx, req)
			// Unanswered, a call would wait out its one-minute context.
			if took := time.Since(start); took > 30*time.Second {
				t.Errorf("%s: returned after %v, deadline %v", c.name, took, deadline)
			}
			if !errors.Is(err, c.want) {
				t.Errorf("%s: error %v, want %v", c.name, err, c.want)
			}
		})
	}
	wg.Wait()

	// The session is given up once a send has been stuck for a while; calls
	// then go to a new process.
	waitFor(t, 15*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		resp, err := p.Execute(ctx, providers.Request{Payload: json.RawMessage(`3`)})
		if err != nil && !providers.IsRetryable(err) {
			t.Fatalf("call after the plugin stopped: %v", err)
		}
		return err == nil && string(resp.Body) == "3"
	}, "a call to succeed on a new process")
	if got := m.Restarts("echo"); got != 1 {
		t.Errorf("Restarts = %d, want 1", got)
	}
	if host.PID(p) == pid {
		t.Error("the stopped process is still the provider's")
	}
	waitGone(t, pid, 10*time.Second)
}

// TestSlowStartIsRetryable has a plugin miss its start timeout, which a
// loaded machine can cause: the call may be retried, and the process is
// not left behind.
func TestSlowStartIsRetryable(t *testing.T) {
	script := filepath.Join(t.TempDir(), "slow-plugin")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexec sleep 30\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	m, _ := newManager(t, host.Options{StartTimeout: 300 * time.Millisecond})
	_, err := call(t, m.Provider(host.Spec{Name: "slow", Path: script}), `{}`)
	if pe := providerError(t, err); !pe.Retryable || pe.Code != "plugin_start" || !strings.Contains(pe.Message, "timeout while waiting for plugin to start") {
		t.Errorf("a start timeout gave %+v, want a retryable plugin_start error", pe)
	}
}
