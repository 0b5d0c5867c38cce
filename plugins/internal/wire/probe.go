package wire

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"

	"github.com/chaingate/gateway/providers"
)

// ProbeAction is the action type that Serve answers itself, before the
// provider sees the call, so that "gateway plugin check" can see what
// reaches a plugin: the request's fields, its deadline, how its ctx ends,
// and bodies of any size. Chains cannot call it: the loader refuses action
// types under providers.ReservedActionPrefix.
const ProbeAction = providers.ReservedActionPrefix + "probe"

// ProbeRequest is the payload of a ProbeAction call; every field is optional.
type ProbeRequest struct {
	// Block waits until the call's ctx ends, then answers how it ended.
	Block bool `json:"block,omitempty"`
	// BodyBytes asks for an answer of exactly this many bytes (at least 2):
	// a JSON string, instead of a ProbeReply.
	BodyBytes int `json:"body_bytes,omitempty"`
	// Pad is ballast, to make a large request.
	Pad string `json:"pad,omitempty"`
}

// ProbeReply is the answer to a ProbeAction call: what arrived.
type ProbeReply struct {
	ActionType string `json:"action_type"`
	DedupKey   string `json:"dedup_key"`
	Attempt    int    `json:"attempt"`
	RunID      string `json:"run_id"`
	Step       string `json:"step"`
	// Deadline is the request's deadline and CtxDeadline that of the ctx a
	// provider gets, in Unix nanoseconds; 0 when there is none.
	Deadline      int64  `json:"deadline"`
	CtxDeadline   int64  `json:"ctx_deadline"`
	PayloadBytes  int    `json:"payload_bytes"`
	PayloadSHA256 string `json:"payload_sha256"`
	// Ended is how a blocking call's ctx ended, such as "context canceled".
	Ended string `json:"ended,omitempty"`
}

// Probing answers the reserved action types and hands every other call to
// the provider.
type Probing struct {
	providers.Provider
}

func (p Probing) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	switch {
	case req.ActionType == ProbeAction:
		return probe(ctx, req)
	case strings.HasPrefix(req.ActionType, providers.ReservedActionPrefix):
		return providers.Response{}, providers.Permanent("unknown_action", "action type %q is reserved for the gateway and unknown to this plugin", req.ActionType)
	}
	return p.Provider.Execute(ctx, req)
}

func probe(ctx context.Context, req providers.Request) (providers.Response, error) {
	var pr ProbeRequest
	if len(req.Payload) > 0 {
		if err := json.Unmarshal(req.Payload, &pr); err != nil {
			return providers.Response{}, providers.Permanent("bad_payload", "decoding the probe request: %v", err)
		}
	}
	if pr.BodyBytes != 0 {
		if limit := MaxMessageFromEnv(); pr.BodyBytes < 2 || pr.BodyBytes > limit {
			return providers.Response{}, providers.Permanent("bad_payload", "body_bytes must be from 2 to the message limit %d, got %d", limit, pr.BodyBytes)
		}
		body := make([]byte, pr.BodyBytes)
		for i := range body {
			body[i] = 'x'
		}
		body[0], body[len(body)-1] = '"', '"'
		return providers.Response{Body: body}, nil
	}
	sum := sha256.Sum256(req.Payload)
	reply := ProbeReply{
		ActionType:    req.ActionType,
		DedupKey:      req.DedupKey,
		Attempt:       req.Attempt,
		RunID:         req.RunID,
		Step:          req.Step,
		PayloadBytes:  len(req.Payload),
		PayloadSHA256: hex.EncodeToString(sum[:]),
	}
	if !req.Deadline.IsZero() {
		reply.Deadline = req.Deadline.UnixNano()
	}
	if d, ok := ctx.Deadline(); ok {
		reply.CtxDeadline = d.UnixNano()
	}
	if pr.Block {
		<-ctx.Done()
		reply.Ended = ctx.Err().Error()
	}
	body, err := json.Marshal(reply)
	if err != nil {
		return providers.Response{}, providers.Permanent("bad_response", "encoding the probe reply: %v", err)
	}
	return providers.Response{Body: body}, nil
}
