package loader_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/loader"
)

const fanoutChain = `
[[providers]]
name = "p"
type = "echo"

[[chains]]
name = "c"
[[chains.steps]]
name = "inventory"
provider = "p"
[[chains.steps]]
name = "loop"
[chains.steps.split]
items = "<<steps.inventory.body.hosts>>"
mode = "distributed"
[[chains.steps.split.steps]]
name = "ping"
provider = "p"
`

const fanoutTable = `
[gateway.fanout]
rabbitmq_url = "amqp://guest:guest@127.0.0.1:5672/"
redis_url = "redis://127.0.0.1:6379/0"
`

func TestFanoutDefaults(t *testing.T) {
	defaults := chain.Fanout{
		RabbitMQURL: "amqp://guest:guest@127.0.0.1:5672/", RedisURL: "redis://127.0.0.1:6379/0",
		Prefix: chain.DefaultFanoutPrefix, Threshold: chain.DefaultFanoutThreshold,
		BatchSize: chain.DefaultFanoutBatchSize, MaxInFlight: chain.DefaultFanoutMaxInFlight,
		ItemTimeoutSeconds: chain.DefaultFanoutItemTimeoutSeconds, MaxRedeliveries: chain.DefaultFanoutMaxRedeliveries,
		Prefetch: chain.DefaultFanoutPrefetch, WorkerConcurrency: chain.DefaultFanoutWorkerConcurrency,
		ClaimTTLSeconds: chain.DefaultFanoutClaimTTLSeconds,
	}
	withBatch := defaults
	withBatch.BatchSize, withBatch.MaxInFlight, withBatch.Prefix = 10_000, 10_000, "a"
	for _, tc := range []struct {
		name, src string
		want      *chain.Fanout
	}{
		{"no table", "[gateway]\nlisten = \"127.0.0.1:8080\"\n", nil},
		{"urls only", fanoutTable, &defaults},
		{"bounds", fanoutTable + "batch_size = 10000\nmax_in_flight = 10000\nprefix = \"a\"\n", &withBatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := loader.LoadBytes("x.toml", []byte(tc.src), loadOpts)
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Gateway.Fanout; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestSplitModeSet checks that every split the valid configs hold, nested
// ones included, has a mode whether or not it was written.
func TestSplitModeSet(t *testing.T) {
	files, _ := filepath.Glob("testdata/valid/*.toml")
	var check func(*testing.T, []*chain.Step)
	check = func(t *testing.T, steps []*chain.Step) {
		for _, s := range steps {
			if s.Parallel != nil {
				check(t, s.Parallel.Steps)
			}
			if s.Split != nil {
				if s.Split.Mode == "" {
					t.Errorf("split %s has no mode", s.Source.Path)
				}
				check(t, s.Split.Steps)
			}
		}
	}
	for _, f := range files {
		cfg, err := loader.Load([]string{f}, loadOpts)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cfg.Chains {
			check(t, c.Steps)
		}
	}
}

// TestFanoutURLs checks the URL rules, and that no message shows the
// password, however it was (mis)written.
func TestFanoutURLs(t *testing.T) {
	const secret = "s3cret"
	for _, tc := range []struct {
		key, url, want string
	}{
		{"rabbitmq_url", "amqps://ops:s3cret@mq.example.com:5671/prod?heartbeat=10", ""},
		{"redis_url", "rediss://:s3cret@redis.example.com:6380/2", ""},
		{"rabbitmq_url", "amqp://ops:s3%2Fcret@mq.example.com/", ""},
		{"rabbitmq_url", "http://ops:s3cret@mq.example.com/", `"http://ops:xxxxx@mq.example.com/" is not a URL with a host and scheme amqp or amqps`},
		{"redis_url", "redis:///0?password=s3cret", `"redis:///0" is not a URL with a host and scheme redis or rediss`},
		{"redis_url", "127.0.0.1:6379", "is not a valid URL"},
		{"rabbitmq_url", "amqp://ops:s3cret@mq.example.com/#s3cret", ""},
		{"rabbitmq_url", "amqp://ops:s3/cret@mq.example.com/", "is not a valid URL"},
		{"rabbitmq_url", "amqp://ops:s3cret@mq:bad/", "is not a valid URL"},
		{"rabbitmq_url", "amqp://ops:12/s3cret@mq.example.com/", "holds an '@' past its host"},
		{"rabbitmq_url", "amqp:ops:s3cret@mq.example.com", "holds an '@' past its host"},
		{"redis_url", "", "must not be empty"},
		{"redis_url", "redis://[::1", "is not a valid URL"},
	} {
		t.Run(tc.key+"="+tc.url, func(t *testing.T) {
			urls := map[string]string{"rabbitmq_url": "amqp://127.0.0.1/", "redis_url": "redis://127.0.0.1/"}
			urls[tc.key] = tc.url
			src := "[gateway.fanout]\nrabbitmq_url = \"" + urls["rabbitmq_url"] + "\"\nredis_url = \"" + urls["redis_url"] + "\"\n"
			cfg, err := loader.LoadBytes("x.toml", []byte(src), loadOpts)
			got := render(cfg, err)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("got %s", got)
				}
				return
			}
			if !strings.Contains(got, "gateway.fanout."+tc.key+": "+tc.want) {
				t.Errorf("got %s, want gateway.fanout.%s: %s", got, tc.key, tc.want)
			}
			if strings.Contains(got, secret) {
				t.Errorf("the message shows the password: %s", got)
			}
		})
	}
}

// TestDistributedSplitNeedsBroker checks the broker check across files,
// whichever file comes first, and that a stored definition skips it.
func TestDistributedSplitNeedsBroker(t *testing.T) {
	const msg = `chains[c].steps[loop].split.mode: mode "distributed" needs a broker: add [gateway.fanout] with rabbitmq_url and redis_url (or use mode = "auto", which runs locally without one)`
	for _, tc := range []struct {
		name  string
		files []string
		opts  loader.Options
		want  string
	}{
		{"broker in the first file", []string{fanoutTable, fanoutChain}, loadOpts, "ok\n"},
		{"broker in the second file", []string{fanoutChain, fanoutTable}, loadOpts, "ok\n"},
		{"no broker", []string{fanoutChain}, loadOpts, "f0.toml:15:1: " + msg + "\n"},
		{"no broker, another [gateway]", []string{"[gateway]\nlisten = \"127.0.0.1:8080\"\n", fanoutChain}, loadOpts, "f1.toml:15:1: " + msg + "\n"},
		{"stored", []string{fanoutChain}, storedOpts, "ok\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for i, src := range tc.files {
				name := filepath.Join(dir, "f"+string(rune('0'+i))+".toml")
				if err := os.WriteFile(name, []byte(src), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cfg, err := loader.Load([]string{dir}, tc.opts)
			if got := strings.ReplaceAll(render(cfg, err), dir+string(filepath.Separator), ""); got != tc.want {
				t.Errorf("got\n%swant\n%s", got, tc.want)
			}
		})
	}
}

// TestStoredDefinitionNeedsStored checks that the definition of a chain
// with a distributed split, which has no [gateway] table, loads only as a
// stored one.
func TestStoredDefinitionNeedsStored(t *testing.T) {
	cfg, err := loader.LoadBytes("x.toml", []byte(fanoutTable+fanoutChain), loadOpts)
	if err != nil {
		t.Fatal(err)
	}
	def, err := cfg.Definition("c")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loader.LoadBytes("definition.toml", def, loadOpts); err == nil || !strings.Contains(err.Error(), "needs a broker") {
		t.Errorf("loaded as a config: %v", err)
	}
	again, err := loader.LoadBytes("definition.toml", def, storedOpts)
	if err != nil {
		t.Fatal(err)
	}
	if again.Chains["c"].Hash != cfg.Chains["c"].Hash || again.Chains["c"].Step("loop").Split.Mode != chain.SplitDistributed {
		t.Error("the stored definition did not round-trip")
	}
}
