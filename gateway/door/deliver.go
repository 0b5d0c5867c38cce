package door

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/gateway/api"
)

// NewInbound is a delivery as the door works it, or the error that
// refuses it.
func NewInbound(tr *chain.Trigger, body []byte, h http.Header, sig string, meta map[string]string) (*inbound, error) {
	doc, err := engine.DecodeJSON(body)
	if err != nil {
		return nil, api.BadRequest("invalid_json", "the request body must be one JSON value: %v", err)
	}
	in := &inbound{tr: tr, doc: doc, key: sig, meta: meta}
	if tr.Type.Alerts() {
		if err := checkAlertGroup(tr, doc); err != nil {
			return nil, err
		}
	} else {
		in.headers = webhookHeaders(h)
		if sig == "" {
			in.key = h.Get("Idempotency-Key")
		}
	}
	return in, nil
}

// Deliver hands a trigger's delivery to the door as if it had arrived
// with those headers and passed the trigger's authentication, and returns
// what the door did, once every run it started is created: what `gateway
// test` runs a request fixture through.
func (gw *Door) Deliver(ctx context.Context, trigger string, body []byte, h http.Header) (api.TriggerResponse, error) {
	tr := gw.Config.Triggers[trigger]
	if tr == nil {
		return api.TriggerResponse{}, fmt.Errorf("delivering to trigger %q: no such trigger", trigger)
	}
	in, err := NewInbound(tr, body, h, "", map[string]string{"trigger": tr.Name})
	if err != nil {
		return api.TriggerResponse{}, fmt.Errorf("delivering to trigger %q: %w", trigger, err)
	}
	return gw.DeliverInbound(ctx, in, time.Time{}), nil
}

// webhookHeaders are a webhook's headers as its mappings read them: the
// first value of each, by lower-case name, none that may carry a
// credential.
func webhookHeaders(h http.Header) map[string]any {
	out := map[string]any{}
	for name, vals := range h {
		if len(vals) == 0 || credentialHeader(name, vals[0]) {
			continue
		}
		out[strings.ToLower(name)] = vals[0]
	}
	return out
}
