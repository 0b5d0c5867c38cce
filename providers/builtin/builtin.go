// Package builtin is the registry of the providers compiled into the gateway.
// The gateway serves them from its own binary (see host.BuiltinEnv).
//
// It is the gateway's own package, with no compatibility promise.
package builtin

import (
	"maps"
	"slices"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/echo"
	"github.com/chaingate/gateway/providers/email"
	execprovider "github.com/chaingate/gateway/providers/exec"
	"github.com/chaingate/gateway/providers/faulty"
	httpprovider "github.com/chaingate/gateway/providers/http"
	"github.com/chaingate/gateway/providers/opsgenie"
	"github.com/chaingate/gateway/providers/pagerduty"
	"github.com/chaingate/gateway/providers/slack"
	sshprovider "github.com/chaingate/gateway/providers/ssh"
	"github.com/chaingate/gateway/providers/webhook"
)

var constructors = map[string]func() providers.Provider{
	"echo":      echo.New,
	"email":     email.New,
	"exec":      execprovider.New,
	"faulty":    faulty.New,
	"http":      httpprovider.New,
	"opsgenie":  opsgenie.New,
	"pagerduty": pagerduty.New,
	"slack":     slack.New,
	"ssh":       sshprovider.New,
	"webhook":   webhook.New,
}

// New returns a new provider of the built-in type typ, and whether there is one.
func New(typ string) (providers.Provider, bool) {
	c, ok := constructors[typ]
	if !ok {
		return nil, false
	}
	return c(), true
}

// Types lists the built-in provider types, sorted.
func Types() []string {
	return slices.Sorted(maps.Keys(constructors))
}
