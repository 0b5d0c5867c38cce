package server_test

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/internal/testutil/brokertest"
	"github.com/chaingate/gateway/internal/testutil/redistest"
	goredis "github.com/redis/go-redis/v9"
)

// TestURLCredentialsFromSecrets opens a gateway whose store and fan-out
// need passwords, read from secrets: a Redis that requires one holding
// characters a URL reserves, written as the secret's plain value; the
// broker's password in its URL; and the fan-out Redis whose whole URL is
// one secret. The gateway opens only if each reached its server; with a
// wrong password it does not, and does not say the password.
func TestURLCredentialsFromSecrets(t *testing.T) {
	const password = "p@ss/w:rd?#%"
	rd := redistest.Start(t)
	admin := goredis.NewClient(&goredis.Options{Addr: rd.Addr})
	if err := admin.ConfigSet(t.Context(), "requirepass", password).Err(); err != nil {
		t.Fatal(err)
	}
	_ = admin.Close()
	broker, prefix := brokertest.Open(t)
	bu, err := url.Parse(broker)
	if err != nil {
		t.Fatal(err)
	}
	mqPassword, _ := bu.User.Password()
	bu.User = url.UserPassword(bu.User.Username(), "MQPASS")
	mqURL := strings.Replace(bu.String(), "MQPASS", "<<secrets.MQ_PASSWORD>>", 1)

	config := `[gateway]
state = "redis://:<<secrets.REDIS_PASSWORD>>@` + rd.Addr + `/0?allow_volatile=true"
[gateway.fanout]
rabbitmq_url = "` + mqURL + `"
redis_url = "<<secrets.FANOUT_REDIS_URL>>"
prefix = "` + prefix + `"

[[providers]]
name = "echo"
type = "echo"

[[chains]]
name = "c"
[[chains.steps]]
name = "s"
provider = "echo"
`
	path := filepath.Join(t.TempDir(), "gw.toml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := gateway.LoadConfig([]string{path})
	if err != nil {
		t.Fatal(err)
	}
	open := func(redisPassword string) error {
		t.Setenv("CHAINGATE_SECRET_REDIS_PASSWORD", redisPassword)
		t.Setenv("CHAINGATE_SECRET_MQ_PASSWORD", mqPassword)
		t.Setenv("CHAINGATE_SECRET_FANOUT_REDIS_URL", "redis://:"+url.QueryEscape(password)+"@"+rd.Addr+"/1")
		gw, err := gateway.Open(t.Context(), gateway.Options{Config: cfg})
		if err == nil {
			err = gw.Close()
		}
		return err
	}
	if err := open(password); err != nil {
		t.Fatalf("opening with the passwords from secrets: %v", err)
	}
	err = open("not-the-password")
	if err == nil || strings.Contains(err.Error(), "not-the-password") {
		t.Errorf("opening with a wrong password: %v", err)
	}

	// Without the secrets, the gateway does not open, and says where each
	// is read and how to give it.
	os.Unsetenv("CHAINGATE_SECRET_REDIS_PASSWORD")
	os.Unsetenv("CHAINGATE_SECRET_FANOUT_REDIS_URL")
	_, err = gateway.Open(t.Context(), gateway.Options{Config: cfg})
	var ce *chain.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("opening without the secrets: %v", err)
	}
	for _, want := range []string{
		"gw.toml:2:1: gateway.state: <<secrets.REDIS_PASSWORD>>: no secret REDIS_PASSWORD: set CHAINGATE_SECRET_REDIS_PASSWORD",
		"gw.toml:5:1: gateway.fanout.redis_url: <<secrets.FANOUT_REDIS_URL>>: no secret FANOUT_REDIS_URL: set CHAINGATE_SECRET_FANOUT_REDIS_URL",
	} {
		if !strings.Contains(ce.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, ce)
		}
	}
}
