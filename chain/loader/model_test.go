package loader_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/loader"
)

// dump renders a loaded config as indented JSON, so golden files show what
// the loader understood.
func dump(cfg *chain.Config) string {
	type stepOut struct {
		Name, Kind, Provider, ActionType, OnFailure, When, DefaultNext, SubChain string `json:",omitempty"`
		TimeoutSeconds, DelaySeconds                                             int    `json:",omitempty"`
		Payload, Input                                                           []string
		Retry                                                                    *chain.Retry `json:",omitempty"`
		Branches                                                                 []string     `json:",omitempty"`
		Parallel                                                                 any          `json:",omitempty"`
		Split                                                                    any          `json:",omitempty"`
		Source                                                                   string
		Concurrency                                                              any      `json:",omitempty"`
		Catch                                                                    []string `json:",omitempty"`
	}
	concurrency := func(c *chain.Concurrency) any {
		if c == nil {
			return nil
		}
		var reads []string
		for _, r := range c.Key.Refs() {
			reads = append(reads, r.Text)
		}
		return map[string]any{"key_reads": reads, "limit": c.Limit, "on_busy": c.OnBusy, "queue_limit": c.QueueLimit,
			"queue_timeout_seconds": c.QueueTimeoutSeconds, "source": filepath.Base(c.Source.File) + ":" + strconv.Itoa(c.Source.Line) + " " + c.Source.Path}
	}
	var steps func([]*chain.Step) []stepOut
	steps = func(list []*chain.Step) []stepOut {
		var out []stepOut
		for _, s := range list {
			o := stepOut{
				Name: s.Name, Kind: s.Kind.String(), Provider: s.Provider, ActionType: s.ActionType,
				OnFailure: string(s.OnFailure), DefaultNext: s.DefaultNext, SubChain: s.SubChain,
				TimeoutSeconds: s.TimeoutSeconds, DelaySeconds: s.DelaySeconds, Retry: s.Retry,
				Source: filepath.Base(s.Source.File) + ":" + strconv.Itoa(s.Source.Line) + " " + s.Source.Path,
			}
			if s.When != nil {
				o.When = s.When.String()
			}
			if s.Payload != nil {
				for _, r := range s.Payload.Refs() {
					o.Payload = append(o.Payload, r.Text)
				}
			}
			if s.Input != nil {
				for _, r := range s.Input.Refs() {
					o.Input = append(o.Input, r.Text)
				}
			}
			for _, b := range s.Branches {
				o.Branches = append(o.Branches, b.Cond.String()+" → "+b.Target)
			}
			for _, c := range s.Catch {
				o.Catch = append(o.Catch, fmt.Sprintf("%v → %s (recover %v)", c.Errors, c.Target, c.Recover))
			}
			if p := s.Parallel; p != nil {
				o.Parallel = map[string]any{"join": p.Join, "on_failure": p.OnFailure, "timeout_seconds": p.TimeoutSeconds,
					"max_concurrency": p.MaxConcurrency, "steps": steps(p.Steps)}
			}
			if sp := s.Split; sp != nil {
				o.Split = map[string]any{"items": sp.Items.Refs()[0].Text, "mode": sp.Mode, "max_concurrency": sp.MaxConcurrency,
					"tolerated": sp.ToleratedFailures, "percent": sp.ToleratedPercent, "tolerated_of_50": sp.Tolerated(50),
					"timeout_seconds": sp.TimeoutSeconds, "steps": steps(sp.Steps)}
			}
			o.Concurrency = concurrency(s.Concurrency)
			out = append(out, o)
		}
		return out
	}
	var chains []any
	for _, name := range cfg.ChainNames {
		c := cfg.Chains[name]
		out := map[string]any{"name": c.Name, "timeout_seconds": c.TimeoutSeconds, "hash_len": len(c.Hash), "steps": steps(c.Steps)}
		if c.Concurrency != nil {
			out["concurrency"] = concurrency(c.Concurrency)
		}
		if len(c.OnFailure)+len(c.Finally) > 0 {
			out["on_failure"], out["finally"] = steps(c.OnFailure), steps(c.Finally)
			out["finally_on_cancel"], out["handlers_timeout_seconds"] = c.FinallyOnCancel, c.HandlersTimeoutSeconds
		}
		chains = append(chains, out)
	}
	var provs []any
	for _, name := range cfg.ProviderNames {
		p := cfg.Providers[name]
		out := map[string]any{"name": p.Name, "type": p.Type, "timeout_seconds": p.TimeoutSeconds, "config": json.RawMessage(orNull(p.Config))}
		if p.RateLimit != nil {
			out["rate_limit"] = p.RateLimit
		}
		if p.MaxConcurrency > 0 {
			out["max_concurrency"] = p.MaxConcurrency
		}
		if p.CircuitBreaker != nil {
			out["circuit_breaker"] = p.CircuitBreaker
		}
		provs = append(provs, out)
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	_ = enc.Encode(map[string]any{"gateway": cfg.Gateway, "providers": provs, "chains": chains})
	return b.String()
}

func orNull(b []byte) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return b
}

// TestValidConfigs loads every file under testdata/valid and compares what
// the loader understood with its .golden file.
func TestValidConfigs(t *testing.T) {
	files, _ := filepath.Glob("testdata/valid/*.toml")
	if len(files) == 0 {
		t.Fatal("no test files")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			cfg, err := loader.Load([]string{f}, loadOpts)
			if err != nil {
				t.Fatalf("loading %s:\n%v", f, err)
			}
			checkGolden(t, strings.TrimSuffix(f, ".toml")+".golden", dump(cfg))
		})
	}
}

func TestChainHashFollowsDefinition(t *testing.T) {
	load := func(src string) *chain.Chain {
		cfg, err := loader.LoadBytes("x.toml", []byte(`
[[providers]]
name = "p"
type = "echo"
`+src), loadOpts)
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Chains["c"]
	}
	a := load("[[chains]]\nname = \"c\"\n[[chains.steps]]\nname = \"s\"\nprovider = \"p\"\n")
	b := load("# a comment\n[[chains]]\nname = \"c\"\n\n[[chains.steps]]\nprovider = \"p\"\nname = \"s\"\n")
	c := load("[[chains]]\nname = \"c\"\n[[chains.steps]]\nname = \"s\"\nprovider = \"p\"\ntimeout_seconds = 3\n")
	if a.Hash != b.Hash {
		t.Error("formatting changed the definition hash")
	}
	if a.Hash == c.Hash {
		t.Error("a changed definition kept its hash")
	}
}

// TestChainHashCoversDefinition checks that the hash changes with anything
// the stored definition holds, sub-chains and providers included, and with
// nothing else.
func TestChainHashCoversDefinition(t *testing.T) {
	const base = `
[[providers]]
name = "p"
type = "echo"
[providers.config]
level = 1
[[providers]]
name = "unused"
type = "echo"
[[chains]]
name = "parent"
[[chains.steps]]
name = "call"
sub_chain = "child"
[[chains]]
name = "child"
[[chains.steps]]
name = "c1"
provider = "p"
[[chains]]
name = "other"
[[chains.steps]]
name = "o1"
provider = "unused"
`
	hash := func(src string) string {
		t.Helper()
		cfg, err := loader.LoadBytes("x.toml", []byte(src), loadOpts)
		if err != nil {
			t.Fatal(err)
		}
		def, err := cfg.Definition("parent")
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(def)
		if got := cfg.Chains["parent"].Hash; got != hex.EncodeToString(sum[:]) {
			t.Fatalf("hash %s is not the SHA-256 of the definition", got)
		}
		return cfg.Chains["parent"].Hash
	}
	before := hash(base)
	for _, tc := range []struct {
		name, from, to string
		changes        bool
	}{
		{"child step", `name = "c1"
provider = "p"`, `name = "c1"
provider = "p"
timeout_seconds = 1`, true},
		{"used provider config", "level = 1", "level = 2", true},
		{"unused provider", `name = "unused"
type = "echo"`, `name = "unused"
type = "echo"
timeout_seconds = 3`, false},
		{"used provider limits", "level = 1", `level = 1
[providers.rate_limit]
per_second = 2.0`, false},
		{"unrelated chain", `name = "o1"`, `name = "o2"`, false},
		{"comment", `[[chains]]
name = "parent"`, `# the parent
[[chains]]
name = "parent"`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(base, tc.from) {
				t.Fatalf("base does not hold %q", tc.from)
			}
			if after := hash(strings.Replace(base, tc.from, tc.to, 1)); (after != before) != tc.changes {
				t.Errorf("hash changed: %v, want %v", after != before, tc.changes)
			}
		})
	}
}

func FuzzLoad(f *testing.F) {
	files, _ := filepath.Glob("testdata/*/*.toml")
	for _, name := range files {
		if data, err := readFile(name); err == nil {
			f.Add(data)
		}
	}
	// Each of these once loaded without an error and then crashed whatever
	// read the step it left half configured.
	const head = "[[providers]]\nname = \"p\"\ntype = \"echo\"\n[[chains]]\nname = \"c\"\n[[chains.steps]]\nname = \"a\"\n"
	for _, tail := range []string{
		"provider = \"p\"\n[[chains.steps.branches]]\nwhen = \"\"\ntarget = \"end\"\n",
		"[chains.steps.split]\nitems = \"\"\n[[chains.steps.split.steps]]\nname = \"t\"\nprovider = \"p\"\n",
		"provider = \"\"\n",
		"sub_chain = \"\"\n",
	} {
		f.Add([]byte(head + tail))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := loader.LoadBytes("fuzz.toml", data, loadOpts)
		if err != nil {
			return
		}
		if cfg == nil {
			t.Fatal("no config and no error")
		}
		// Whatever loads must be drawable and storable, and its stored
		// definition must load back to the same chain.
		for _, name := range cfg.ChainNames {
			c := cfg.Chains[name]
			_ = c.Input.Check(name, json.RawMessage(`{"a": [1, {"b": null}]}`))
			_ = c.Input.Check(name, data)
			_ = c.Mermaid()
			if _, err := json.Marshal(c.Graph()); err != nil {
				t.Fatalf("chain %s: encoding its graph: %v", name, err)
			}
			def, err := cfg.Definition(name)
			if err != nil {
				t.Fatalf("chain %s: %v", name, err)
			}
			again, err := loader.LoadBytes("definition.toml", def, storedOpts)
			if err != nil {
				t.Fatalf("chain %s: its definition does not load:\n%v\n%s", name, err, def)
			}
			if again.Chains[name].Hash != c.Hash {
				t.Fatalf("chain %s: its definition loads with another hash:\n%s", name, def)
			}
		}
	})
}

// TestDefinitionRoundTrip checks that a chain's stored definition loads back
// to the same chain, hash included, with the chains and providers it needs.
func TestDefinitionRoundTrip(t *testing.T) {
	cfg, err := loader.Load([]string{"testdata/valid/everything.toml"}, loadOpts)
	if err != nil {
		t.Fatal(err)
	}
	src, err := cfg.Definition("incident-response")
	if err != nil {
		t.Fatal(err)
	}
	again, err := loader.LoadBytes("definition.toml", src, storedOpts)
	if err != nil {
		t.Fatalf("stored definition does not load:\n%v\n%s", err, src)
	}
	for _, name := range []string{"incident-response", "page-secondary"} {
		if again.Chains[name] == nil || again.Chains[name].Hash != cfg.Chains[name].Hash {
			t.Errorf("chain %s did not round-trip", name)
		}
	}
	if len(again.Providers) != 2 {
		t.Errorf("providers: %v", again.ProviderNames)
	}
	// Everything but where it was written down must match; the [gateway]
	// table is not part of a chain's definition.
	cfg.Gateway, again.Gateway = chain.Gateway{}, chain.Gateway{}
	strip := regexp.MustCompile(`(?m)^\s*"Source": .*\n`)
	if a, b := strip.ReplaceAllString(dump(again), ""), strip.ReplaceAllString(dump(cfg), ""); a != b {
		t.Errorf("the reloaded definition differs:\n%s\n---\n%s", a, b)
	}
}

// TestOutlineLeavesOutProviderConfig checks that the definition shown to
// people has no provider config tables, where credentials may be written.
func TestOutlineLeavesOutProviderConfig(t *testing.T) {
	cfg, err := loader.Load([]string{"testdata/valid/everything.toml"}, loadOpts)
	if err != nil {
		t.Fatal(err)
	}
	full, _ := cfg.Definition("incident-response")
	outline, err := cfg.Outline("incident-response")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(full), "monitoring.example.com") {
		t.Fatalf("the stored definition lost the provider config:\n%s", full)
	}
	if strings.Contains(string(outline), "monitoring.example.com") || !strings.Contains(string(outline), `name = "monitoring"`) {
		t.Errorf("outline:\n%s", outline)
	}
}

// TestMermaid compares the drawing of the example chain with its golden file.
func TestMermaid(t *testing.T) {
	cfg, err := loader.Load([]string{"testdata/valid/everything.toml"}, loadOpts)
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "testdata/valid/everything.mermaid", cfg.Chains["incident-response"].Mermaid())
}

// TestMermaidFailureRoutes draws catch routes as dashed edges labelled
// with what they catch, and the handler lists as subgraphs of their own.
func TestMermaidFailureRoutes(t *testing.T) {
	cfg, err := loader.Load([]string{"testdata/valid/failure_routes.toml"}, loadOpts)
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "testdata/valid/failure_routes.mermaid", cfg.Chains["clean-logs"].Mermaid())
}
