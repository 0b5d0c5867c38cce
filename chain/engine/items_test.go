package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/chaingate/gateway/chain/store"
)

// TestSplitItemValues renders the items of splits again after the run, at
// the top and inside other splits' items, where the items template reads
// the enclosing item and the step its item ran before.
func TestSplitItemValues(t *testing.T) {
	h := newHarness(t, `
[[chains]]
name = "c"
[[chains.steps]]
name = "regions"
[chains.steps.split]
items = "<<origin.payload.regions>>"
[[chains.steps.split.steps]]
name = "zone"
provider = "echo"
payload_template = { hosts = "<<item.hosts>>", zone = "<<item.name>>" }
[[chains.steps.split.steps]]
name = "hosts"
[chains.steps.split.steps.split]
items = "<<prev.body.hosts>>"
[[chains.steps.split.steps.split.steps]]
name = "ports"
[chains.steps.split.steps.split.steps.split]
items = "<<item.ports>>"
[[chains.steps.split.steps.split.steps.split.steps]]
name = "probe"
provider = "echo"
payload_template = { port = "<<item>>" }
`)
	res := h.run("c", `{"regions": [
		{"name": "eu", "hosts": [{"name": "a0", "ports": [22]}]},
		{"name": "us", "hosts": [{"name": "b0", "ports": [80, 443]}, {"name": "b1", "ports": []}]}]}`)
	if res.Status != store.RunSucceeded {
		t.Fatalf("run %s: %+v", res.Status, res.Error)
	}
	for _, tc := range []struct {
		split   string
		indexes []int
		want    map[int]string
		err     error
	}{
		{"regions", []int{1, 5}, map[int]string{1: `{"hosts":[{"name":"b0","ports":[80,443]},{"name":"b1","ports":[]}],"name":"us"}`}, nil},
		{"regions[0]/hosts", []int{0}, map[int]string{0: `{"name":"a0","ports":[22]}`}, nil},
		{"regions[1]/hosts", []int{0, 1}, map[int]string{0: `{"name":"b0","ports":[80,443]}`, 1: `{"name":"b1","ports":[]}`}, nil},
		{"regions[1]/hosts[0]/ports", []int{0, 1}, map[int]string{0: `80`, 1: `443`}, nil},
		{"regions[7]/hosts", []int{0}, nil, store.ErrNotFound},
		{"hosts", []int{0}, nil, store.ErrNotFound},
		{"regions[1]/zone", []int{0}, nil, store.ErrNotFound},
		{"regions[1]/hosts[0]", []int{0}, nil, store.ErrNotFound},
		{"regions[x]/hosts", []int{0}, nil, store.ErrNotFound},
	} {
		t.Run(tc.split, func(t *testing.T) {
			got, err := h.eng.SplitItemValues(context.Background(), res.ID, tc.split, tc.indexes)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("got %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Errorf("got %d items, want %d: %v", len(got), len(tc.want), got)
			}
			for i, want := range tc.want {
				if !jsonEqual(got[i], want) {
					t.Errorf("item %d: got %s, want %s", i, got[i], want)
				}
			}
		})
	}
}

func jsonEqual(a json.RawMessage, b string) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return string(xb) == string(yb)
}
