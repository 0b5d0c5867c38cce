package crashpoint_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/bolt"
	"github.com/chaingate/gateway/chain/store/crashpoint"
)

func TestParse(t *testing.T) {
	tests := []struct {
		spec string
		want crashpoint.Point
		err  string
	}{
		{spec: "create", want: crashpoint.Point{When: crashpoint.Create}},
		{spec: "after notify/sub-03 succeeded", want: crashpoint.Point{When: crashpoint.After, Key: "notify/sub-03", Status: store.StepSucceeded}},
		{spec: "  before   loop[05]  running ", want: crashpoint.Point{When: crashpoint.Before, Key: "loop[05]", Status: store.StepRunning}},
		{spec: "after x done", err: `unknown step status "done"`},
		{spec: "during x running", err: `want "create"`},
		{spec: "after x", err: `want "create"`},
		{spec: "", err: `want "create"`},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := crashpoint.Parse(tc.spec)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), crashpoint.Env) {
					t.Fatalf("Parse(%q) = %v, want an error naming %s and containing %q", tc.spec, err, crashpoint.Env, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Parse(%q) = %+v, %v; want %+v", tc.spec, got, err, tc.want)
			}
		})
	}
}

// TestWrapDiesOnTheRightSideOfTheCommit checks that a point before a commit
// keeps it from landing and a point after it lets it land first.
func TestWrapDiesOnTheRightSideOfTheCommit(t *testing.T) {
	type died struct{}
	tests := []struct {
		spec        string
		batch       int // the batch the process should die at, 0-based; -1 never
		landedSteps int // how many of the batches' step records are stored then
	}{
		{"create", 0, 0},
		{"before a running", 1, 0},
		{"after a running", 1, 1},
		{"after a succeeded", 2, 1},
		{"before b running", -1, 1},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			inner, err := bolt.Open(filepath.Join(t.TempDir(), "gw.db"), bolt.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer inner.Close()
			p, err := crashpoint.Parse(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			st := crashpoint.Wrap(inner, p, func() { panic(died{}) })
			ctx := context.Background()
			run := &store.Run{ID: "r1", Chain: "c", Status: store.RunRunning}
			batches := []*store.Batch{
				{Run: run, Create: true},
				{Run: run, Steps: []*store.StepRecord{{Key: "a", Name: "a", Status: store.StepRunning}}},
				{Run: run, Steps: []*store.StepRecord{{Key: "a", Name: "a", Status: store.StepSucceeded}}},
			}
			diedAt := -1
			for i, b := range batches {
				func() {
					defer func() {
						if r := recover(); r != nil {
							if _, ok := r.(died); !ok {
								panic(r)
							}
							diedAt = i
						}
					}()
					if err := st.Commit(ctx, b); err != nil {
						t.Fatal(err)
					}
				}()
				if diedAt >= 0 {
					break
				}
			}
			if diedAt != tc.batch {
				t.Fatalf("died at batch %d, want %d", diedAt, tc.batch)
			}
			steps, err := inner.Steps(ctx, "r1", "")
			if err != nil && tc.batch != 0 {
				t.Fatal(err)
			}
			if len(steps) != tc.landedSteps {
				t.Errorf("%d step records landed, want %d", len(steps), tc.landedSteps)
			}
		})
	}
}
