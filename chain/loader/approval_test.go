package loader_test

import (
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/loader"
)

// TestApprovalCallTiming checks remind_every and escalate.after: whole
// seconds from one second up are taken as written, and what the gateway
// could not honour to the second is refused at its key.
func TestApprovalCallTiming(t *testing.T) {
	for _, tc := range []struct {
		every, after       string
		wantEvery, wantAft time.Duration
		err                string
	}{
		{every: "1s", after: "1s", wantEvery: time.Second, wantAft: time.Second},
		{every: "90s", after: "1h30m", wantEvery: 90 * time.Second, wantAft: 90 * time.Minute},
		{every: "0", after: "2d", wantAft: 48 * time.Hour},
		{every: "999ms", after: "1m", err: `gw.toml:8:60: chains[c].steps[ask].approval.notify.remind_every: must be whole seconds, at least 1s ("90s", "15m"): calls are timed to the second; got 999ms`},
		{every: "4.5s", after: "1m", err: `gw.toml:8:60: chains[c].steps[ask].approval.notify.remind_every: must be whole seconds, at least 1s ("90s", "15m"): calls are timed to the second; got 4.5s`},
		{every: "1m", after: "1500ms", err: `gw.toml:9:62: chains[c].steps[ask].approval.escalate.after: must be whole seconds, at least 1s ("90s", "15m"): calls are timed to the second; got 1.5s`},
	} {
		t.Run(tc.every+"/"+tc.after, func(t *testing.T) {
			cfg, err := loader.LoadBytes("gw.toml", []byte(`[[providers]]
name = "pager"
type = "echo"
[[chains]]
name = "c"
[[chains.steps]]
name = "ask"
approval.notify = { provider = "pager", action_type = "x", remind_every = "`+tc.every+`" }
approval.escalate = { provider = "pager", action_type = "x", after = "`+tc.after+`" }
`), loadOpts)
			if tc.err != "" {
				if got := render(cfg, err); got != tc.err+"\n" {
					t.Errorf("got\n%swant\n%s", got, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			a := cfg.Chains["c"].Steps[0].Approval
			if a.Notify.Every != tc.wantEvery || a.Escalate.After != tc.wantAft {
				t.Errorf("every %s, after %s; want %s, %s", a.Notify.Every, a.Escalate.After, tc.wantEvery, tc.wantAft)
			}
		})
	}
}
