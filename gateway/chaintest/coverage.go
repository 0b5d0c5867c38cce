package chaintest

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
)

// Coverage is what a suite's cases exercised of the chains and triggers
// of the configs they test: each step run, each route out of a step with
// branches taken, each when condition found both true and false.
type Coverage struct {
	Chains   []ChainCoverage   `json:"chains"`
	Triggers []TriggerCoverage `json:"triggers,omitempty"`
	// Percent is covered items over all items, over every chain and
	// trigger.
	Percent float64 `json:"percent"`
}

// ChainCoverage is one chain's.
type ChainCoverage struct {
	Chain   string  `json:"chain"`
	Covered int     `json:"covered"`
	Total   int     `json:"total"`
	Percent float64 `json:"percent"`
	// Missed are the items no case exercised, each with its line.
	Missed []string `json:"missed"`
}

// TriggerCoverage is one trigger's: its when condition, true and false.
type TriggerCoverage struct {
	Trigger string   `json:"trigger"`
	Missed  []string `json:"missed"`
}

// seen is what the cases did, by chain: a chain is its name in the file
// that defines it, whichever config loads that file, so two configs may
// each have a chain of one name.
type seen struct {
	cfg    *chain.Config   // the config of the result being noted
	ran    map[string]bool // chain/step
	routes map[string]bool // chain/step → target (or "" for the default route)
	when   map[string]bool // chain/step/true|false
	fired  map[string]bool // trigger/true|false
}

// Cover works out the coverage of results, cases of s.
func Cover(s *Suite, results []*Result) *Coverage {
	sn := seen{ran: map[string]bool{}, routes: map[string]bool{}, when: map[string]bool{}, fired: map[string]bool{}}
	cfgOf := map[string]*chain.Config{}
	files := map[string]map[string]bool{} // chain name → files defining one
	for _, f := range s.Files {
		cfg := s.Config(f)
		cfgOf[f.Path] = cfg
		for _, name := range cfg.ChainNames {
			if files[name] == nil {
				files[name] = map[string]bool{}
			}
			files[name][cfg.Chains[name].Source.File] = true
		}
	}
	for _, r := range results {
		sn.cfg = cfgOf[r.File]
		for _, rr := range r.Runs {
			sn.run(rr)
		}
		sn.calls(r)
		if r.Trigger != nil {
			for _, tr := range r.Trigger.Results {
				switch tr.Action {
				case "skipped":
					sn.fired[r.Trigger.Trigger+"/false"] = true
				case "started", "replayed", "queued":
					sn.fired[r.Trigger.Trigger+"/true"] = true
				}
			}
		}
	}
	cov := &Coverage{Chains: []ChainCoverage{}}
	covered, total := 0, 0
	done := map[string]bool{}
	for _, f := range s.Files {
		cfg := s.Config(f)
		for _, name := range cfg.ChainNames {
			ch := cfg.Chains[name]
			if done[chainKey(ch)] {
				continue
			}
			done[chainKey(ch)] = true
			label := name
			if len(files[name]) > 1 {
				label = fmt.Sprintf("%s (%s)", name, ch.Source.File)
			}
			cc := ChainCoverage{Chain: label, Missed: []string{}}
			sn.chain(ch, &cc)
			if cc.Total > 0 {
				cc.Percent = percent(cc.Covered, cc.Total)
			}
			covered, total = covered+cc.Covered, total+cc.Total
			cov.Chains = append(cov.Chains, cc)
		}
		for _, name := range cfg.TriggerNames {
			tr := cfg.Triggers[name]
			if done["trigger/"+name] || tr.When == nil {
				continue
			}
			done["trigger/"+name] = true
			tc := TriggerCoverage{Trigger: name, Missed: []string{}}
			for _, v := range []string{"true", "false"} {
				total++
				if sn.fired[name+"/"+v] {
					covered++
					continue
				}
				tc.Missed = append(tc.Missed, fmt.Sprintf("%s: when never %s", where(tr.Source.Key("when")), v))
			}
			cov.Triggers = append(cov.Triggers, tc)
		}
	}
	cov.Percent = percent(covered, total)
	return cov
}

func percent(n, of int) float64 {
	if of == 0 {
		return 100
	}
	return float64(int(1000*float64(n)/float64(of))) / 10
}

func where(src chain.Source) string { return fmt.Sprintf("%s:%d", src.File, src.Line) }

// chainKey names a chain by the file that defines it and its name.
func chainKey(ch *chain.Chain) string { return ch.Source.File + "|" + ch.Name }

// chainKey is the key of the chain named name in the config being noted.
func (sn *seen) chainKey(name string) string {
	if ch := sn.cfg.Chains[name]; ch != nil {
		return chainKey(ch)
	}
	return name
}

// run notes what one run did.
func (sn *seen) run(rr *RunRecord) {
	c := sn.chainKey(rr.Run.Chain)
	byKey := map[string]*store.StepRecord{}
	for _, rec := range rr.Steps {
		byKey[rec.Key] = rec
		if rec.Status == store.StepPending {
			continue
		}
		name, _ := stepName(rec.Key)
		filtered := rec.Status == store.StepSkipped && rec.Attempts == 0 && rec.Error == nil
		if filtered {
			sn.when[c+"/"+name+"/false"] = true
			continue
		}
		sn.ran[c+"/"+name] = true
		sn.when[c+"/"+name+"/true"] = true
	}
	sn.failureRoutes(c, rr.Run)
	// Routes of top-level steps, from the path the run took.
	for i, name := range rr.Run.Path {
		rec := byKey[name]
		if rec == nil || (rec.Status != store.StepSucceeded && rec.Status != store.StepSkipped) {
			continue
		}
		next := chain.EndTarget
		if i+1 < len(rr.Run.Path) {
			next = rr.Run.Path[i+1]
		}
		if sn.phaseOf(rr.Run.Chain, next) != sn.phaseOf(rr.Run.Chain, name) {
			// The handlers ran after the run's steps (or the phase before) ended.
			next = chain.EndTarget
		}
		sn.routes[c+"/"+name+"→"+next] = true
	}
}

// calls notes what the calls of a case's runs did: the steps of a split's
// items keep no record of their own, so their calls say which ran, and in
// what order, item by item.
func (sn *seen) calls(res *Result) {
	chainOf := map[string]string{}
	for _, rr := range res.Runs {
		chainOf[rr.Run.ID] = sn.chainKey(rr.Run.Chain)
	}
	items := map[string][]string{} // run and item key → steps called, in order
	var order []string
	for _, call := range res.Calls {
		c := chainOf[call.RunID]
		name, index := stepName(call.Step)
		sn.ran[c+"/"+name] = true
		sn.when[c+"/"+name+"/true"] = true
		if index < 0 {
			continue
		}
		item := call.RunID + " " + call.Step[:strings.LastIndex(call.Step, "/")]
		if _, ok := items[item]; !ok {
			order = append(order, item)
		}
		if steps := items[item]; len(steps) == 0 || steps[len(steps)-1] != name {
			items[item] = append(steps, name)
		}
	}
	for _, item := range order {
		c := chainOf[item[:strings.Index(item, " ")]]
		steps := items[item]
		for i, name := range steps {
			next := chain.EndTarget
			if i+1 < len(steps) {
				next = steps[i+1]
			}
			sn.routes[c+"/"+name+"→"+next] = true
		}
	}
}

// chain adds one chain's items to cc.
func (sn *seen) chain(ch *chain.Chain, cc *ChainCoverage) {
	var walk func(list []*chain.Step)
	miss := func(src chain.Source, format string, args ...any) {
		cc.Missed = append(cc.Missed, where(src)+": "+fmt.Sprintf(format, args...))
	}
	item := func(ok bool, src chain.Source, format string, args ...any) {
		cc.Total++
		if ok {
			cc.Covered++
			return
		}
		miss(src, format, args...)
	}
	walk = func(list []*chain.Step) {
		for _, s := range list {
			key := chainKey(ch) + "/" + s.Name
			item(sn.ran[key], s.Source, "step %s never ran", s.Name)
			if s.When != nil {
				item(sn.when[key+"/true"], s.Source.Key("when"), "step %s: when never true", s.Name)
				item(sn.when[key+"/false"], s.Source.Key("when"), "step %s: when never false", s.Name)
			}
			if len(s.Branches) > 0 {
				targets := []string{}
				for _, b := range s.Branches {
					if !slices.Contains(targets, b.Target) {
						targets = append(targets, b.Target)
					}
				}
				otherwise := s.DefaultNext
				if otherwise == "" {
					otherwise = chain.EndTarget
					if n := s.Next(); n != nil {
						otherwise = n.Name
					}
				}
				for _, b := range s.Branches {
					item(sn.routed(chainKey(ch), s.Name, b.Target), b.Source, "step %s: branch to %s never taken", s.Name, b.Target)
				}
				if !slices.Contains(targets, otherwise) {
					item(sn.routed(chainKey(ch), s.Name, otherwise), s.Source, "step %s: no branch matched (on to %s) never happened", s.Name, otherwise)
				}
			}
			if s.Parallel != nil {
				walk(s.Parallel.Steps)
			}
			if s.Split != nil {
				walk(s.Split.Steps)
			}
		}
	}
	walk(ch.Steps)
	sn.failureItems(ch, item)
	walk(ch.OnFailure)
	walk(ch.Finally)
}

func (sn *seen) routed(chainName, from, to string) bool {
	return sn.routes[chainName+"/"+from+"→"+to]
}

// Print writes the coverage for people.
func (c *Coverage) Print(w io.Writer) {
	fmt.Fprintln(w, "coverage:")
	for _, cc := range c.Chains {
		fmt.Fprintf(w, "  %-32s %5.1f%%  (%d of %d)\n", cc.Chain, cc.Percent, cc.Covered, cc.Total)
		for _, m := range cc.Missed {
			fmt.Fprintf(w, "      %s\n", m)
		}
	}
	for _, tc := range c.Triggers {
		state := "covered"
		if len(tc.Missed) > 0 {
			state = "not covered"
		}
		fmt.Fprintf(w, "  trigger %-24s %s\n", tc.Trigger, state)
		for _, m := range tc.Missed {
			fmt.Fprintf(w, "      %s\n", m)
		}
	}
	fmt.Fprintf(w, "  total %.1f%%\n", c.Percent)
}
