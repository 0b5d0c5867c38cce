package faulty_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/faulty"
)

func TestExecute(t *testing.T) {
	for _, tc := range []struct {
		name      string
		payload   string
		attempt   int
		want      string // body on success
		wantErr   string // prefix of the error message on failure
		retryable bool
	}{
		{name: "object", payload: `{"a":1,"b":{"c":[1]}}`, attempt: 2, want: `{"a":1,"b":{"c":[1]},"attempt":2}`},
		{name: "string", payload: `"x"`, attempt: 1, want: `{"attempt":1,"payload":"x"}`},
		{name: "array", payload: `[1,2]`, attempt: 1, want: `{"attempt":1,"payload":[1,2]}`},
		{name: "null", payload: `null`, attempt: 1, want: `{"attempt":1,"payload":null}`},
		{name: "empty", payload: ``, attempt: 1, want: `{"attempt":1,"payload":null}`},
		{name: "fail", payload: `{"fail":"broken"}`, attempt: 1, wantErr: "broken"},
		{name: "fail_retryable", payload: `{"fail_retryable":"later"}`, attempt: 1, wantErr: "later", retryable: true},
		{name: "fail wins over fail_times", payload: `{"fail":"broken","fail_times":5}`, attempt: 1, wantErr: "broken"},
		{name: "fail_times failing", payload: `{"fail_times":2}`, attempt: 2, wantErr: "failing attempt 2 of the first 2", retryable: true},
		{name: "fail_times passed", payload: `{"fail_times":2}`, attempt: 3, want: `{"fail_times":2,"attempt":3}`},
		{name: "short sleep", payload: `{"sleep_ms":5}`, attempt: 1, want: `{"sleep_ms":5,"attempt":1}`},
		{name: "bad control", payload: `{"crash":"yes"}`, attempt: 1, wantErr: "decoding faulty controls: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := faulty.New().Execute(context.Background(), providers.Request{Payload: json.RawMessage(tc.payload), Attempt: tc.attempt})
			if tc.wantErr != "" {
				var pe *providers.Error
				if !errors.As(err, &pe) || !strings.HasPrefix(pe.Message, tc.wantErr) || pe.Retryable != tc.retryable {
					t.Fatalf("error = %#v, want message %q retryable %v", err, tc.wantErr, tc.retryable)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			assertJSON(t, resp.Body, tc.want)
		})
	}
}

func assertJSON(t *testing.T, got json.RawMessage, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("body %q: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("body = %s, want %s", got, want)
	}
}

func TestContextEnds(t *testing.T) {
	for _, payload := range []string{`{"sleep_ms":60000}`, `{"hang":true}`} {
		t.Run(payload, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := faulty.New().Execute(ctx, providers.Request{Payload: json.RawMessage(payload)})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v is not context.DeadlineExceeded", err)
			}
			// The call sleeps a minute or hangs: only the deadline ends it.
			if d := time.Since(start); d > 30*time.Second {
				t.Errorf("returned after %v", d)
			}
		})
	}
}

func TestRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	const n = 100
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			// record comes first, so even a failing call leaves its line.
			payload := fmt.Sprintf(`{"record":%q,"i":%d,"fail":"after recording","pad":"%0500d"}`, path, i, i)
			_, err := faulty.New().Execute(context.Background(), providers.Request{
				ActionType: "act", Payload: json.RawMessage(payload), DedupKey: fmt.Sprintf("run/%d", i), Attempt: 1,
			})
			if err == nil {
				t.Errorf("call %d succeeded", i)
			}
		})
	}
	wg.Wait()

	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var rec struct {
			DedupKey   string `json:"dedup_key"`
			Attempt    int    `json:"attempt"`
			ActionType string `json:"action_type"`
			Payload    struct {
				I int `json:"i"`
			} `json:"payload"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("torn line %q: %v", sc.Text(), err)
		}
		if rec.DedupKey != fmt.Sprintf("run/%d", rec.Payload.I) || rec.Attempt != 1 || rec.ActionType != "act" {
			t.Errorf("record %+v does not match its call", rec)
		}
		seen[rec.DedupKey] = true
	}
	if len(seen) != n {
		t.Errorf("%d distinct records, want %d", len(seen), n)
	}
}

// TestCrash runs the crash in a child process, since it ends the process.
func TestCrash(t *testing.T) {
	if os.Getenv("FAULTY_TEST_CRASH") == "1" {
		_, _ = faulty.New().Execute(context.Background(), providers.Request{Payload: json.RawMessage(`{"crash":true}`)})
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrash$")
	cmd.Env = append(os.Environ(), "FAULTY_TEST_CRASH=1")
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Errorf("crash ended the process with %v, want exit status 3", err)
	}
}
