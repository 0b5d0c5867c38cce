package api

import (
	"slices"
	"strings"

	"github.com/chaingate/gateway/chain/store"
)

// startedKinds are the ways a run starts, as a runs listing filters by
// them (the API's started_by, the command line's --started-by).
var startedKinds = []string{store.StartedByTrigger, store.StartedBySchedule, store.StartedByAPI, store.StartedByCLI, store.StartedByReplay, store.StartedBySubChain}

// StartedKinds are the ways a run starts, for a form to offer as choices.
func StartedKinds() []string { return slices.Clone(startedKinds) }

// CheckStartedBy refuses a value of the named parameter (the API's
// started_by, the command line's --started-by) no run can match: it is ""
// (any), a kind, or a trigger's or schedule's kind and name ("trigger:am").
func CheckStartedBy(param, v string) error {
	if v == "" {
		return nil
	}
	kind, name, named := strings.Cut(v, ":")
	switch {
	case !slices.Contains(startedKinds, kind):
		return BadRequest("invalid_parameter", "%s %q is not one of %s (trigger and schedule may add :NAME)", param, v, strings.Join(startedKinds, ", "))
	case named && kind != store.StartedByTrigger && kind != store.StartedBySchedule:
		return BadRequest("invalid_parameter", "%s %q: only trigger and schedule take a name; %s runs are listed by %q", param, v, kind, kind)
	case named && name == "":
		return BadRequest("invalid_parameter", "%s %q names no %s: give %s or %s:NAME", param, v, kind, kind, kind)
	}
	return nil
}

// CheckHideChains refuses a value of the named parameter (the API's
// hide_chain, the command line's --hide-chain) no chain can be named. A
// chain's name holds no comma, so one with a comma was meant as a list: the
// parameter is repeated instead, as an HTML form sends it.
func CheckHideChains(param string, names []string) error {
	for _, n := range names {
		switch {
		case n == "":
			return BadRequest("invalid_parameter", "%s is empty: give the name of a chain to hide", param)
		case strings.Contains(n, ","):
			return BadRequest("invalid_parameter", "%s %q is not a chain name: repeat %s for each chain to hide", param, n, param)
		}
	}
	return nil
}
