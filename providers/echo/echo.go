// Package echo is the echo provider: it answers with the payload it was given.
// It is useful for wiring chains together and for measuring the plugin path.
//
// It is the gateway's own package, with no compatibility promise.
package echo

import (
	"context"
	"encoding/json"

	"github.com/chaingate/gateway/providers"
)

// Provider is the echo provider.
type Provider struct{}

// New returns the echo provider.
func New() providers.Provider { return Provider{} }

func (Provider) Describe(context.Context) (providers.Info, error) {
	return providers.Info{Name: "echo", Version: "1"}, nil
}

func (Provider) Execute(_ context.Context, req providers.Request) (providers.Response, error) {
	if len(req.Payload) == 0 {
		return providers.Response{Body: json.RawMessage("null")}, nil
	}
	return providers.Response{Body: req.Payload}, nil
}
