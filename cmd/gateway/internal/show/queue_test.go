package show

import (
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/gateway/api"
)

func TestRunsShowSaysWhereARunWaits(t *testing.T) {
	var b strings.Builder
	v := &api.RunView{Run: &api.Run{ID: "01m8h25bc08yg0dnv3st5t06bv", Chain: "fix-host", Status: "queued", CreatedAt: time.Now(),
		Queue: &api.QueuePlace{Key: "db-1", Position: 2, WaitingFor: []string{"01m8h25awrbxg3rkmdj6krvdq6"}, Since: time.Now()}}}
	Run(&b, v)
	if out := b.String(); !strings.Contains(out, `queue    key "db-1", place 2, waiting for 01m8h25awrbxg3rkmdj6krvdq6, since `) || !strings.Contains(out, "status   queued") {
		t.Errorf("gateway runs show printed:\n%s", out)
	}
}
