package authz_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/gateway/authz"
)

func testPolicy() *authz.Policy {
	return authz.NewPolicy(chain.Auth{
		Roles: map[string]*chain.Role{
			"disk": {Name: "disk", Grants: []chain.Grant{
				{Actions: []chain.Action{authz.Read, authz.Start, authz.Approve, authz.Cancel, authz.Replay, authz.Redrive, authz.Delete}, Chains: []string{"disk-*"}},
				{Actions: []chain.Action{authz.Pause, authz.Replay, authz.Delete}, Triggers: []string{"alertmanager"}},
				{Actions: []chain.Action{authz.Pause}, Schedules: []string{"nightly"}},
			}},
			"ops":     {Name: "ops", Grants: []chain.Grant{{Actions: []chain.Action{authz.Backup, authz.Admin}}}},
			"readall": {Name: "readall", Grants: []chain.Grant{{Actions: []chain.Action{authz.Read}, Chains: []string{"*"}}}},
		},
		Users:  map[string][]string{"alice": {"disk"}},
		Groups: map[string][]string{"sre": {"ops"}, "viewers": {"readall"}},
	})
}

// TestPolicyMatrix asks, for each action on each kind of target, as a
// subject that holds the grant and as one that does not.
func TestPolicyMatrix(t *testing.T) {
	p := testPolicy()
	alice := authz.Subject{Kind: authz.Person, Name: "alice"}
	bob := authz.Subject{Kind: authz.Person, Name: "bob", Groups: []string{"viewers"}}
	sre := authz.Subject{Kind: authz.Person, Name: "carol", Groups: []string{"sre"}}
	diskToken := authz.Subject{Kind: authz.Token, Name: "am", Roles: []string{"disk"}}
	full := authz.Subject{Kind: authz.Token, Name: "root", Write: true}
	read := authz.Subject{Kind: authz.Token, Name: "dash"}
	run := func(chain string) authz.Target { return authz.Target{Kind: authz.OnRun, Name: "r1", Chain: chain} }
	tests := []struct {
		sub    authz.Subject
		action authz.Action
		target authz.Target
		allow  bool
	}{
		{alice, authz.Start, authz.Target{Kind: authz.OnChain, Name: "disk-full"}, true},
		{alice, authz.Start, authz.Target{Kind: authz.OnChain, Name: "db-restart"}, false},
		{bob, authz.Start, authz.Target{Kind: authz.OnChain, Name: "disk-full"}, false},
		{alice, authz.Read, run("disk-full"), true},
		{alice, authz.Read, run("db-restart"), false},
		{alice, authz.Read, run(""), false},
		{bob, authz.Read, run("db-restart"), true},
		{bob, authz.Read, authz.Target{Kind: authz.OnRun}, true},
		{alice, authz.Read, authz.Target{Kind: authz.OnRun}, false},
		{alice, authz.Read, authz.Target{Kind: authz.OnRun, Chain: "disk-full"}, true},
		{alice, authz.Approve, run("disk-full"), true},
		{bob, authz.Approve, run("disk-full"), false},
		{alice, authz.Cancel, run("disk-full"), true},
		{alice, authz.Cancel, run("db"), false},
		{alice, authz.Replay, authz.Target{Kind: authz.OnDLQ, Name: "d1", Chain: "disk-full"}, true},
		{alice, authz.Replay, authz.Target{Kind: authz.OnDLQ, Name: "d2", Trigger: "alertmanager"}, true},
		{alice, authz.Replay, authz.Target{Kind: authz.OnDLQ, Name: "d3", Trigger: "github"}, false},
		{alice, authz.Replay, authz.Target{Kind: authz.OnDLQ}, false},
		{alice, authz.Redrive, run("disk-full"), true},
		{bob, authz.Redrive, run("disk-full"), false},
		{alice, authz.Delete, run("disk-full"), true},
		{alice, authz.Delete, authz.Target{Kind: authz.OnRun}, false},
		{alice, authz.Pause, authz.Target{Kind: authz.OnTrigger, Name: "alertmanager"}, true},
		{alice, authz.Pause, authz.Target{Kind: authz.OnTrigger, Name: "github"}, false},
		{alice, authz.Pause, authz.Target{Kind: authz.OnSchedule, Name: "nightly"}, true},
		{alice, authz.Pause, authz.Target{Kind: authz.OnSchedule, Name: "hourly"}, false},
		{alice, authz.Backup, authz.Target{Kind: authz.OnGateway}, false},
		{sre, authz.Backup, authz.Target{Kind: authz.OnGateway}, true},
		{sre, authz.Admin, authz.Target{Kind: authz.OnGateway}, true},
		{sre, authz.Read, run("disk-full"), false},
		{bob, authz.Admin, authz.Target{Kind: authz.OnGateway}, false},
		{diskToken, authz.Start, authz.Target{Kind: authz.OnChain, Name: "disk-full"}, true},
		{diskToken, authz.Start, authz.Target{Kind: authz.OnChain, Name: "db"}, false},
		{diskToken, authz.Deliver, authz.Target{Kind: authz.OnTrigger, Name: "alertmanager"}, false},
		{full, authz.Backup, authz.Target{Kind: authz.OnGateway}, true},
		{full, authz.Delete, authz.Target{Kind: authz.OnRun}, true},
		{read, authz.Read, run("x"), true},
		{read, authz.Cancel, run("x"), false},
		{authz.Subject{Kind: authz.Trigger, Name: "trigger am", Trigger: "am"}, authz.Deliver, authz.Target{Kind: authz.OnTrigger, Name: "am"}, true},
		{authz.Subject{Kind: authz.Trigger, Name: "trigger am", Trigger: "am"}, authz.Deliver, authz.Target{Kind: authz.OnTrigger, Name: "other"}, false},
		{authz.Subject{Kind: authz.Trigger, Name: "trigger am", Trigger: "am"}, authz.Start, authz.Target{Kind: authz.OnChain, Name: "disk-full"}, false},
		{authz.Subject{Kind: authz.Slack, Name: "alice"}, authz.Approve, run("disk-full"), true},
		{authz.Subject{Kind: authz.Slack, Name: "alice"}, authz.Approve, run("db"), false},
		{authz.Subject{Kind: authz.Slack, Name: "alice"}, authz.Cancel, run("disk-full"), false},
		{authz.Subject{Kind: authz.Slack, Name: "mallory"}, authz.Approve, run("disk-full"), false},
		{authz.Subject{Kind: authz.Person, Name: "mallory"}, authz.Read, run("disk-full"), false},
		{authz.Subject{Kind: authz.Loopback}, authz.Backup, authz.Target{Kind: authz.OnGateway}, true},
		{authz.Subject{}, authz.Read, run("x"), false},
	}
	for _, tc := range tests {
		err := p.Decide(tc.sub, tc.action, tc.target)
		if (err == nil) != tc.allow {
			t.Errorf("%s (%s) %s on %+v: got %v, want allowed %v", tc.sub.Name, tc.sub.Kind, tc.action, tc.target, err, tc.allow)
		}
		var d *authz.Denied
		if err != nil && (!errors.As(err, &d) || !errors.Is(err, authz.ErrDenied) || d.Missing == "") {
			t.Errorf("%s %s: a refusal that says nothing: %v", tc.sub.Name, tc.action, err)
		}
	}
}

// TestPolicyWithoutRoles keeps what a gateway did before roles: a full
// token anything, a read token reading, a Slack user answering approvals.
func TestPolicyWithoutRoles(t *testing.T) {
	p := authz.NewPolicy(chain.Auth{})
	run := authz.Target{Kind: authz.OnRun, Name: "r1"}
	for _, a := range authz.Actions() {
		if err := p.Decide(authz.Subject{Kind: authz.Token, Name: "root", Write: true}, a, run); err != nil {
			t.Errorf("a full token may not %s: %v", a, err)
		}
		err := p.Decide(authz.Subject{Kind: authz.Token, Name: "dash"}, a, run)
		if (err == nil) != (a == authz.Read) {
			t.Errorf("a read token asking to %s: %v", a, err)
		}
		if a != authz.Read && err != nil && !strings.Contains(err.Error(), "may only read") {
			t.Errorf("a read token's refusal: %v", err)
		}
		err = p.Decide(authz.Subject{Kind: authz.Slack, Name: "anyone"}, a, run)
		if (err == nil) != (a == authz.Approve) {
			t.Errorf("a Slack user asking to %s: %v", a, err)
		}
	}
	if p.Scoped(authz.Subject{Kind: authz.Token, Write: true}) {
		t.Error("a full token's answer depends on the run's chain")
	}
}

func TestDeniedSaysWhatIsMissing(t *testing.T) {
	err := testPolicy().Decide(authz.Subject{Kind: authz.Person, Name: "alice"}, authz.Cancel, authz.Target{Kind: authz.OnRun, Name: "r9", Chain: "db-restart"})
	want := "no role of alice (disk) grants cancel on run r9 (chain db-restart)"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v, want it to say %q", err, want)
	}
}
