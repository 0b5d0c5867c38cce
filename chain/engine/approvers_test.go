package engine

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
)

func TestMayAnswer(t *testing.T) {
	run := &store.Run{Origin: store.Origin{Subject: "alice"}}
	both := &chain.Approval{Approvers: []string{"alice", "bob", "group:sre"}, FourEyes: true}
	tests := []struct {
		name string
		a    *chain.Approval
		id   *Identity
		says string // "" when allowed
	}{
		{"no rule, no identity", &chain.Approval{}, nil, ""},
		{"the starter, four eyes", both, &Identity{Name: "alice"}, "four eyes: alice started this run"},
		{"another approver", both, &Identity{Name: "bob"}, ""},
		{"a group member", both, &Identity{Name: "carol", Groups: []string{"dev", "sre"}}, ""},
		{"neither named nor in the group", both, &Identity{Name: "dave", Groups: []string{"dev"}}, "dave is not among the step's approvers (alice, bob, group:sre)"},
		{"a name like a group", both, &Identity{Name: "group:sre"}, "not among"},
		{"four eyes only, another person", &chain.Approval{FourEyes: true}, &Identity{Name: "bob"}, ""},
		{"four eyes only, the starter", &chain.Approval{FourEyes: true}, &Identity{Name: "alice"}, "four eyes"},
		{"who answers is not known", both, nil, "who answers is not known"},
		{"an empty name", both, &Identity{}, "who answers is not known"},
	}
	for _, tc := range tests {
		ctx := context.Background()
		if tc.id != nil {
			ctx = WithIdentity(ctx, *tc.id)
		}
		err := mayAnswer(ctx, tc.a, run)
		var nae *NotApproverError
		switch {
		case tc.says == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.says != "" && (!errors.As(err, &nae) || !strings.Contains(err.Error(), tc.says)):
			t.Errorf("%s: %v, want a refusal saying %q", tc.name, err, tc.says)
		}
	}
	// A run no one started (a sub-chain's, an old one) has no starter for
	// four eyes to exclude.
	if err := mayAnswer(WithIdentity(context.Background(), Identity{Name: "alice"}), &chain.Approval{FourEyes: true}, &store.Run{}); err != nil {
		t.Errorf("four eyes on a run without a starter: %v", err)
	}
}
