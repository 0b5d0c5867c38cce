package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
)

// Client runs Ops against a gateway's HTTP API.
type Client struct {
	base  string
	token string
	http  *http.Client
}

var _ Ops = (*Client)(nil)

// NewClient returns a client for the API at base (http://host:port).
func NewClient(base, token string) *Client {
	return &Client{base: strings.TrimRight(base, "/"), token: token, http: &http.Client{}}
}

func (c *Client) request(ctx context.Context, method, path string, query url.Values, header http.Header, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encoding the request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("building the request: %w", err)
	}
	maps.Copy(req.Header, header)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("calling %s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		var e struct {
			Error *APIError `json:"error"`
		}
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(data, &e) == nil && e.Error != nil {
			e.Error.Status = resp.StatusCode
			return nil, e.Error
		}
		return nil, &APIError{Status: resp.StatusCode, Code: "http_" + strconv.Itoa(resp.StatusCode), Message: strings.TrimSpace(string(data))}
	}
	return resp, nil
}

func (c *Client) do(ctx context.Context, method, path string, query url.Values, body, out any) error {
	return c.doWith(ctx, method, path, query, nil, body, out)
}

// doWith is do, sending header's fields too.
func (c *Client) doWith(ctx context.Context, method, path string, query url.Values, header http.Header, body, out any) error {
	resp, err := c.request(ctx, method, path, query, header, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("reading the answer to %s %s: %w", method, path, err)
	}
	return nil
}

func since(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.Format(time.RFC3339)
}

// StartRun implements Ops. The API's answer to a start its key replays
// names the run and its status, not the labels it started with.
func (c *Client) StartRun(ctx context.Context, chainName string, payload json.RawMessage, opts StartOptions) (*Run, error) {
	if len(bytes.TrimSpace(payload)) == 0 {
		payload = json.RawMessage(`{}`)
	}
	q := url.Values{}
	for _, k := range slices.Sorted(maps.Keys(opts.Labels)) {
		q.Add("label", k+"="+opts.Labels[k])
	}
	header := http.Header{}
	if opts.IdempotencyKey != "" {
		header.Set("Idempotency-Key", opts.IdempotencyKey)
	}
	var out StartResponse
	if err := c.doWith(ctx, http.MethodPost, "/v1/chains/"+url.PathEscape(chainName)+"/runs", q, header, payload, &out); err != nil {
		return nil, err
	}
	run := &Run{ID: out.ID, Chain: out.Chain, Status: out.Status, StartedBy: store.StartedByAPI}
	if !out.Replayed {
		run.Labels = opts.Labels
	}
	return run, nil
}

// ListRuns implements Ops.
func (c *Client) ListRuns(ctx context.Context, f store.RunFilter) (RunPage, error) {
	q := url.Values{}
	setIf(q, "chain", f.Chain)
	setIf(q, "status", string(f.Status))
	setIf(q, "since", since(f.Since))
	setIf(q, "cursor", f.Cursor)
	setIf(q, "started_by", f.StartedBy)
	for _, c := range f.HideChains {
		q.Add("hide_chain", c)
	}
	for _, k := range slices.Sorted(maps.Keys(f.Labels)) {
		if v := f.Labels[k]; v != "" {
			k += "=" + v
		}
		q.Add("label", k)
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	var out RunPage
	err := c.do(ctx, http.MethodGet, "/v1/runs", q, nil, &out)
	return out, err
}

func setIf(q url.Values, k, v string) {
	if v != "" {
		q.Set(k, v)
	}
}

// Run implements Ops.
func (c *Client) Run(ctx context.Context, id string, items bool) (*RunView, error) {
	q := url.Values{}
	if items {
		q.Set("items", "true")
	}
	var out RunView
	if err := c.do(ctx, http.MethodGet, "/v1/runs/"+url.PathEscape(id), q, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RunHeader implements Ops. The API reads the run whole, as GET
// /v1/runs/{id} serves it; its origin is left out here, as a header has
// none.
func (c *Client) RunHeader(ctx context.Context, id string) (*Run, error) {
	v, err := c.Run(ctx, id, false)
	if err != nil {
		return nil, err
	}
	v.Origin = Origin{}
	return v.Run, nil
}

// Step implements Ops.
func (c *Client) Step(ctx context.Context, id, key string) (*Step, error) {
	segs := strings.Split(key, "/")
	for i, seg := range segs {
		segs[i] = url.PathEscape(seg)
	}
	var out Step
	if err := c.do(ctx, http.MethodGet, "/v1/runs/"+url.PathEscape(id)+"/steps/"+strings.Join(segs, "/"), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CancelRun implements Ops.
func (c *Client) CancelRun(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, "/v1/runs/"+url.PathEscape(id)+"/cancel", nil, nil, nil)
}

// DeleteRun implements Ops.
func (c *Client) DeleteRun(ctx context.Context, id string) (*DeleteResult, error) {
	var out DeleteResult
	if err := c.do(ctx, http.MethodDelete, "/v1/runs/"+url.PathEscape(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PruneRuns implements Ops.
func (c *Client) PruneRuns(ctx context.Context, opts PruneOptions) (*PruneResult, error) {
	var out PruneResult
	body := PruneBody{OlderThan: opts.OlderThan.String(), Chain: opts.Chain, Status: string(opts.Status), DryRun: opts.DryRun}
	if err := c.do(ctx, http.MethodPost, "/v1/runs/prune", nil, body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Events implements Ops by reading the run's Server-Sent Events.
func (c *Client) Events(ctx context.Context, id string, after uint64, follow bool, fn func(Event) error) error {
	q := url.Values{"after": {strconv.FormatUint(after, 10)}}
	if !follow {
		q.Set("follow", "false")
	}
	resp, err := c.request(ctx, http.MethodGet, "/v1/runs/"+url.PathEscape(id)+"/events", q, nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev Event
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return fmt.Errorf("reading an event: %w", err)
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("reading events: %w", err)
	}
	return ctx.Err()
}

// DAG implements Ops.
func (c *Client) DAG(ctx context.Context, id string) (*DAG, error) {
	var out DAG
	if err := c.do(ctx, http.MethodGet, "/v1/runs/"+url.PathEscape(id)+"/dag", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func dlqValues(f store.DLQFilter) url.Values {
	q := url.Values{}
	setIf(q, "chain", f.Chain)
	setIf(q, "step", f.Step)
	setIf(q, "since", since(f.Since))
	setIf(q, "after", f.After)
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	return q
}

// SplitItems implements Ops.
func (c *Client) SplitItems(ctx context.Context, id, split, status string, offset, limit int) (*ItemPage, error) {
	q := url.Values{"split": {split}, "offset": {strconv.Itoa(offset)}, "limit": {strconv.Itoa(limit)}}
	setIf(q, "status", status)
	var out ItemPage
	if err := c.do(ctx, http.MethodGet, "/v1/runs/"+url.PathEscape(id)+"/items", q, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListDLQ implements Ops.
func (c *Client) ListDLQ(ctx context.Context, f store.DLQFilter) ([]*DLQEntry, error) {
	var out struct {
		Entries []*DLQEntry `json:"entries"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/dlq", dlqValues(f), nil, &out)
	return out.Entries, err
}

// DLQEntry implements Ops.
func (c *Client) DLQEntry(ctx context.Context, id string) (*DLQEntry, error) {
	var out DLQEntry
	if err := c.do(ctx, http.MethodGet, "/v1/dlq/"+url.PathEscape(id), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Replay implements Ops.
func (c *Client) Replay(ctx context.Context, id string, opts engine.ReplayOptions) (*Run, error) {
	var out struct {
		Run string `json:"run"`
	}
	body := map[string]string{"mode": string(opts.Mode), "definition": string(opts.Definition)}
	if err := c.do(ctx, http.MethodPost, "/v1/dlq/"+url.PathEscape(id)+"/replay", nil, body, &out); err != nil {
		return nil, err
	}
	return &Run{ID: out.Run}, nil
}

// Signal implements Ops.
func (c *Client) Signal(ctx context.Context, id, step, decision, comment string) (*engine.Decision, error) {
	var out engine.Decision
	body := map[string]string{"decision": decision, "comment": comment}
	if err := c.do(ctx, http.MethodPost, "/v1/runs/"+url.PathEscape(id)+"/signals/"+url.PathEscape(step), nil, body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ReplayRun implements Ops.
func (c *Client) ReplayRun(ctx context.Context, id string, opts engine.ReplayOptions) (*Run, error) {
	var out struct {
		Run string `json:"run"`
	}
	body := map[string]string{"mode": string(opts.Mode), "definition": string(opts.Definition)}
	if err := c.do(ctx, http.MethodPost, "/v1/runs/"+url.PathEscape(id)+"/replay", nil, body, &out); err != nil {
		return nil, err
	}
	return &Run{ID: out.Run}, nil
}

// RedriveSplit implements Ops.
func (c *Client) RedriveSplit(ctx context.Context, id, step string, opts engine.RedriveOptions) (*Run, error) {
	var out struct {
		Run string `json:"run"`
	}
	items := RedriveFailed
	if opts.Skipped {
		items = RedriveFailedAndSkipped
	}
	body := map[string]string{"items": items, "definition": string(opts.Definition)}
	if err := c.do(ctx, http.MethodPost, "/v1/runs/"+url.PathEscape(id)+"/steps/"+url.PathEscape(step)+"/redrive", nil, body, &out); err != nil {
		return nil, err
	}
	return &Run{ID: out.Run}, nil
}

// ReplayMany implements Ops. An empty filter replays everything.
func (c *Client) ReplayMany(ctx context.Context, f store.DLQFilter, opts engine.ReplayOptions, concurrency int) (*BulkReplay, error) {
	body := filterBody(f)
	body["mode"], body["definition"], body["concurrency"] = opts.Mode, opts.Definition, concurrency
	var out BulkReplay
	if err := c.do(ctx, http.MethodPost, "/v1/dlq/replay", nil, body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteDLQ implements Ops.
func (c *Client) DeleteDLQ(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/dlq/"+url.PathEscape(id), nil, nil, nil)
}

// filterBody is a bulk request's filter and limit; an empty filter means
// every entry, which the API wants said out loud.
func filterBody(f store.DLQFilter) map[string]any {
	body := map[string]any{"chain": f.Chain, "step": f.Step, "since": since(f.Since), "limit": f.Limit}
	if f.Chain == "" && f.Step == "" && f.Since.IsZero() {
		body["all"] = true
	}
	return body
}

// PurgeDLQ implements Ops. An empty filter purges everything.
func (c *Client) PurgeDLQ(ctx context.Context, f store.DLQFilter) (int, error) {
	body := filterBody(f)
	var out struct {
		Purged int `json:"purged"`
	}
	err := c.do(ctx, http.MethodPost, "/v1/dlq/purge", nil, body, &out)
	return out.Purged, err
}

// Chain returns a chain's definition and graph as the API reports them.
func (c *Client) Chain(ctx context.Context, name string) (map[string]any, error) {
	var out map[string]any
	err := c.do(ctx, http.MethodGet, "/v1/chains/"+url.PathEscape(name), nil, nil, &out)
	return out, err
}

// Schedules lists the gateway's schedules with their next ticks.
func (c *Client) Schedules(ctx context.Context) ([]ScheduleInfo, error) {
	var out struct {
		Schedules []ScheduleInfo `json:"schedules"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/schedules", nil, nil, &out)
	return out.Schedules, err
}

// BackupContentType is the media type of a backup the API streams.
const BackupContentType = "application/vnd.chaingate.backup"

// Backup streams a backup of the gateway's store into w, and returns how
// many bytes it wrote. Only a whole backup ends with its end frame: check
// what was written (backup.Check) before relying on it.
func (c *Client) Backup(ctx context.Context, w io.Writer) (int64, error) {
	resp, err := c.request(ctx, http.MethodPost, "/v1/admin/backup", nil, nil, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != BackupContentType {
		return 0, fmt.Errorf("the answer to POST /v1/admin/backup is %q, not a backup; is %s a gateway?", ct, c.base)
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("reading the backup: %w", err)
	}
	return n, nil
}

// Pause implements Ops.
func (c *Client) Pause(ctx context.Context, kind, name, reason string) (*Pause, error) {
	var p Pause
	if err := c.do(ctx, http.MethodPost, "/v1/pauses/"+url.PathEscape(kind)+"/"+url.PathEscape(name), nil, map[string]string{"reason": reason}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Resume implements Ops.
func (c *Client) Resume(ctx context.Context, kind, name string) (*Pause, error) {
	var p Pause
	err := c.do(ctx, http.MethodDelete, "/v1/pauses/"+url.PathEscape(kind)+"/"+url.PathEscape(name), nil, nil, &p)
	var ae *APIError
	if errors.As(err, &ae) && ae.Code == "not_paused" {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// Pauses implements Ops.
func (c *Client) Pauses(ctx context.Context) ([]*Pause, error) {
	var out struct {
		Pauses []*Pause `json:"pauses"`
	}
	if err := c.do(ctx, http.MethodGet, "/v1/pauses", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Pauses, nil
}
