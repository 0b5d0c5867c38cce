package gateway

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/internal/jsonx"
	"github.com/chaingate/gateway/providers/webhook"
	"github.com/chaingate/gateway/templates"
)

// triggerTTL is how long a trigger remembers what it started: an alert
// Alertmanager keeps sending (every repeat_interval) starts one run for as
// long as it fires, up to this.
const triggerTTL = 7 * 24 * time.Hour

// TriggerResponse is the answer to POST /v1/triggers/{name}: what each
// alert (or the body) did.
type TriggerResponse struct {
	Trigger string          `json:"trigger"`
	Results []TriggerResult `json:"results"`
}

// TriggerResult is what one alert, group or body did: started a run,
// found the run a repeat of it started, or was skipped or refused.
type TriggerResult struct {
	// Action is started, replayed, skipped or failed.
	Action string `json:"action"`
	Run    string `json:"run,omitempty"`
	Chain  string `json:"chain,omitempty"`
	Status string `json:"status,omitempty"`
	// Alert is the alert's fingerprint, for alert triggers.
	Alert string `json:"alert,omitempty"`
	// AlertStatus is firing or resolved.
	AlertStatus string `json:"alert_status,omitempty"`
	// FiringRun is the run a resolved alert's firing started.
	FiringRun string `json:"firing_run,omitempty"`
	Reason    string `json:"reason,omitempty"`
}

// trigger serves POST /v1/triggers/{name}: it maps an inbound alert group
// or webhook body to runs of the trigger's chain.
func (s *Server) trigger(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		s.writeError(w, r, engine.ErrClosed)
		return
	}
	cfg := s.gw.Engine.Config()
	name := r.PathValue("name")
	tr := cfg.Triggers[name]
	if tr == nil {
		msg := fmt.Sprintf("no trigger %q", name)
		if sug := chain.Suggest(name, cfg.TriggerNames); sug != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", sug)
		}
		s.writeError(w, r, &APIError{Status: http.StatusNotFound, Code: "not_found", Message: msg})
		return
	}
	if tr.Token == nil && tr.Secret == nil {
		// No credential of its own: the API's full tokens.
		s.guard(writeAccess, func(w http.ResponseWriter, r *http.Request) { s.fire(w, r, tr) })(w, r)
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.triggerAuth(r, tr, body); err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="chaingate"`)
		s.writeError(w, r, &APIError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: err.Error()})
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	s.fire(w, r.WithContext(engine.WithActor(r.Context(), "trigger "+tr.Name)), tr)
}

// triggerAuth checks a request against the trigger's own credential: its
// bearer token, or its HMAC signature over the body.
func (s *Server) triggerAuth(r *http.Request, tr *chain.Trigger, body []byte) error {
	if tr.Token != nil {
		want, err := s.renderSecret(tr.Token)
		if err != nil {
			return err
		}
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && subtle.ConstantTimeCompare([]byte(tok), want) == 1 {
			return nil
		}
	}
	if tr.Secret != nil {
		key, err := s.renderSecret(tr.Secret)
		if err != nil {
			return err
		}
		switch tr.Signature {
		case chain.SignatureChaingate:
			ts, sig := r.Header.Get(webhook.TimestampHeader), r.Header.Get(webhook.SignatureHeader)
			if sig == "" {
				break
			}
			if err := webhook.Verify(key, ts, sig, body, 0, time.Now()); err != nil {
				return fmt.Errorf("checking the request's signature: %w", err)
			}
			return nil
		default:
			sig, ok := strings.CutPrefix(r.Header.Get("X-Hub-Signature-256"), "sha256=")
			if !ok {
				break
			}
			got, err := hex.DecodeString(sig)
			m := hmac.New(sha256.New, key)
			m.Write(body)
			if err != nil || !hmac.Equal(got, m.Sum(nil)) {
				return errors.New("checking the request's signature: X-Hub-Signature-256 does not match the body")
			}
			return nil
		}
	}
	var ways []string
	if tr.Token != nil {
		ways = append(ways, "its bearer token")
	}
	if tr.Secret != nil {
		if tr.Signature == chain.SignatureChaingate {
			ways = append(ways, "an X-Chaingate-Signature")
		} else {
			ways = append(ways, "an X-Hub-Signature-256 signature")
		}
	}
	return fmt.Errorf("trigger %q needs %s", tr.Name, strings.Join(ways, " or "))
}

// renderSecret renders a trigger credential from the gateway's secrets.
func (s *Server) renderSecret(tpl *templates.Template) ([]byte, error) {
	m := make(map[string]any, len(s.gw.secrets))
	for k, v := range s.gw.secrets {
		m[k] = v
	}
	v, err := tpl.Render(templates.MapScope{"secrets": m})
	if err != nil {
		return nil, fmt.Errorf("rendering the trigger's credential: %w", err)
	}
	str, _ := v.(string)
	if str == "" {
		return nil, errors.New("the trigger's credential is empty")
	}
	return []byte(str), nil
}

// fire maps the request to runs.
func (s *Server) fire(w http.ResponseWriter, r *http.Request, tr *chain.Trigger) {
	body, err := s.readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	doc, err := engine.DecodeJSON(body)
	if err != nil {
		s.writeError(w, r, badRequest("invalid_json", "the request body must be one JSON value: %v", err))
		return
	}
	meta := map[string]string{"trigger": tr.Name, "remote_addr": r.RemoteAddr, "user_agent": r.UserAgent()}
	var results []TriggerResult
	if tr.Type.Alerts() {
		group, ok := doc.(map[string]any)
		alerts, okAlerts := group["alerts"].([]any)
		if !ok || !okAlerts {
			s.writeError(w, r, badRequest("invalid_payload", "this %s trigger takes the webhook's alert group: a JSON object with an alerts array", tr.Type))
			return
		}
		if tr.Per == chain.PerGroup {
			results = []TriggerResult{s.fireGroup(r.Context(), tr, group, alerts, meta)}
		} else {
			for _, a := range alerts {
				results = append(results, s.fireAlert(r.Context(), tr, group, a, meta))
			}
		}
	} else {
		results = []TriggerResult{s.fireWebhook(r.Context(), r, tr, doc, meta)}
	}
	writeJSON(w, triggerCode(results), TriggerResponse{Trigger: tr.Name, Results: results})
}

// triggerCode is 202 when a run started, 422 when every alert failed to
// start its run, and 200 otherwise: repeats and skips.
func triggerCode(results []TriggerResult) int {
	failed := 0
	for _, res := range results {
		switch res.Action {
		case "started":
			return http.StatusAccepted
		case "failed":
			failed++
		}
	}
	if failed > 0 && failed == len(results) {
		return http.StatusUnprocessableEntity
	}
	return http.StatusOK
}

// fireAlert starts the run one alert asks for: the trigger's chain when
// it fires, its resolve chain when it is resolved. The alert's fingerprint
// and startsAt key both, so Alertmanager's repeats start nothing new.
func (s *Server) fireAlert(ctx context.Context, tr *chain.Trigger, group map[string]any, a any, meta map[string]string) TriggerResult {
	alert, ok := a.(map[string]any)
	if !ok {
		return TriggerResult{Action: "failed", Reason: "an alert must be a JSON object"}
	}
	status, _ := alert["status"].(string)
	fp, _ := alert["fingerprint"].(string)
	if fp == "" {
		// Alertmanager before 0.20 sent none: the labels identify the alert.
		labels, _ := jsonx.Marshal(alert["labels"])
		sum := sha256.Sum256(labels)
		fp = hex.EncodeToString(sum[:8])
	}
	startsAt, _ := alert["startsAt"].(string)
	res := TriggerResult{Alert: fp, AlertStatus: status}
	scope := map[string]any{"alert": alert, "group": group}
	key := tr.Name + "/" + fp + "/" + startsAt
	meta = withMeta(meta, "alert_fingerprint", fp, "alert_status", status)
	return s.fireOne(ctx, tr, res, scope, status == "resolved", key, alert, meta)
}

// fireGroup starts one run for a whole alert group, keyed by the group
// and the alerts in it.
func (s *Server) fireGroup(ctx context.Context, tr *chain.Trigger, group map[string]any, alerts []any, meta map[string]string) TriggerResult {
	status, _ := group["status"].(string)
	groupKey, _ := group["groupKey"].(string)
	var ids []string
	for _, a := range alerts {
		if alert, ok := a.(map[string]any); ok {
			fp, _ := alert["fingerprint"].(string)
			startsAt, _ := alert["startsAt"].(string)
			ids = append(ids, fp+"@"+startsAt)
		}
	}
	slices.Sort(ids)
	sum := sha256.Sum256([]byte(groupKey + "\n" + strings.Join(ids, "\n")))
	res := TriggerResult{Alert: hex.EncodeToString(sum[:8]), AlertStatus: status}
	key := tr.Name + "/group/" + res.Alert
	meta = withMeta(meta, "alert_group", groupKey, "alert_status", status)
	return s.fireOne(ctx, tr, res, map[string]any{"group": group}, status == "resolved", key, group, meta)
}

// fireOne starts the run for one alert or group, or its resolve run.
func (s *Server) fireOne(ctx context.Context, tr *chain.Trigger, res TriggerResult, scope map[string]any, resolved bool, key string, whole any, meta map[string]string) TriggerResult {
	if resolved {
		if tr.ResolveChain == "" {
			res.Action, res.Reason = "skipped", "resolved, and the trigger has no resolve_chain"
			return res
		}
		firing, err := s.gw.Store.KeyRun(ctx, "trigger/"+key)
		if err != nil {
			res.Action, res.Reason = "failed", err.Error()
			return res
		}
		res.FiringRun = firing
		scope["firing_run"] = s.firingRun(ctx, firing)
		if ok, reason := s.triggerWhen(tr, scope); !ok {
			res.Action, res.Reason = "skipped", reason
			return res
		}
		var payload any = map[string]any{"alert": whole, "firing_run": scope["firing_run"]}
		if _, perAlert := scope["alert"]; !perAlert {
			payload = map[string]any{"group": whole, "firing_run": scope["firing_run"]}
		}
		if firing != "" {
			meta = withMeta(meta, "firing_run", firing)
		}
		return s.startMapped(ctx, tr.ResolveChain, tr.ResolvePayload, scope, payload, key+"/resolved", meta, res)
	}
	if ok, reason := s.triggerWhen(tr, scope); !ok {
		res.Action, res.Reason = "skipped", reason
		return res
	}
	return s.startMapped(ctx, tr.Chain, tr.Payload, scope, whole, key, meta, res)
}

// fireWebhook starts the run a generic webhook's body asks for.
func (s *Server) fireWebhook(ctx context.Context, r *http.Request, tr *chain.Trigger, body any, meta map[string]string) TriggerResult {
	headers := map[string]any{}
	for name, vals := range r.Header {
		switch name {
		case "Authorization", "Cookie", "X-Hub-Signature-256", webhook.SignatureHeader:
			// Credentials stay out of what a run could store.
		default:
			headers[strings.ToLower(name)] = vals[0]
		}
	}
	scope := map[string]any{"body": body, "headers": headers}
	var res TriggerResult
	if ok, reason := s.triggerWhen(tr, scope); !ok {
		res.Action, res.Reason = "skipped", reason
		return res
	}
	key := r.Header.Get("Idempotency-Key")
	if tr.IdempotencyKey != nil {
		v, err := tr.IdempotencyKey.Render(templates.MapScope(scope))
		if err != nil {
			res.Action, res.Reason = "failed", "rendering idempotency_key: "+err.Error()
			return res
		}
		if v != nil {
			key = fmt.Sprint(v)
		}
	}
	if key != "" {
		key = tr.Name + "/key/" + key
	}
	return s.startMapped(ctx, tr.Chain, tr.Payload, scope, body, key, meta, res)
}

// triggerWhen evaluates the trigger's condition; a condition that cannot
// be evaluated skips the alert and says why.
func (s *Server) triggerWhen(tr *chain.Trigger, scope map[string]any) (bool, string) {
	if tr.When == nil {
		return true, ""
	}
	ok, err := tr.When.Eval(scope)
	if err != nil {
		return false, err.Error()
	}
	if !ok {
		return false, "when is false: " + tr.When.String()
	}
	return true, ""
}

// startMapped renders the run's payload and starts it under key.
func (s *Server) startMapped(ctx context.Context, chainName string, tpl *templates.Template, scope map[string]any, whole any, key string, meta map[string]string, res TriggerResult) TriggerResult {
	res.Chain = chainName
	var payload []byte
	var err error
	if tpl != nil {
		payload, err = tpl.AppendJSON(nil, templates.MapScope(scope))
	} else {
		payload, err = jsonx.Marshal(whole)
	}
	if err != nil {
		res.Action, res.Reason = "failed", "mapping the payload: "+err.Error()
		return res
	}
	mb, _ := jsonx.Marshal(meta)
	if key != "" {
		key = "trigger/" + key
	}
	id, status, replayed, err := s.startKeyed(ctx, chainName, "", key, triggerTTL, engine.Input{Payload: payload, Metadata: mb})
	if err != nil {
		res.Action, res.Reason = "failed", err.Error()
		return res
	}
	res.Run, res.Status, res.Action = id, status, "started"
	if replayed {
		res.Action = "replayed"
	}
	return res
}

// firingRun is what a resolve mapping reads of the run the alert started:
// its id, status, result, and each top-level step's status and body.
func (s *Server) firingRun(ctx context.Context, id string) any {
	if id == "" {
		return nil
	}
	v, err := s.ops.Run(ctx, id, false)
	if err != nil {
		return map[string]any{"id": id}
	}
	steps := map[string]any{}
	for _, name := range v.Path {
		if st := v.Steps[name]; st != nil {
			body, _ := engine.DecodeJSON(st.Body)
			steps[name] = map[string]any{"status": st.Status, "body": body}
		}
	}
	result := v.Body
	if st := v.Steps[v.BodyStep]; v.BodyStep != "" && st != nil {
		result = st.Body
	}
	body, _ := engine.DecodeJSON(result)
	return map[string]any{"id": id, "status": v.Status, "body": body, "steps": steps}
}

func withMeta(meta map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(meta)+len(kv)/2)
	for k, v := range meta {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			out[kv[i]] = kv[i+1]
		}
	}
	return out
}
