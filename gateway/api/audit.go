package api

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
)

// AuditEntry is one entry of the audit log, as GET /v1/audit answers it.
type AuditEntry = store.AuditEntry

// AuditFilter selects entries of the audit log: made in [Since, Until),
// and, each when set, by Subject, for Action, with Outcome, through
// EntryPoint, on Chain. Limit and Cursor page a listing, newest first.
type AuditFilter struct {
	Since, Until time.Time
	Subject      string
	Action       string
	Outcome      string
	EntryPoint   string
	Chain        string
	Limit        int
	Cursor       string
}

// AuditPage is a page of the audit log, newest first; Next continues it.
type AuditPage struct {
	Entries []*AuditEntry `json:"entries"`
	Next    string        `json:"next,omitempty"`
}

// Match reports whether f selects e, times and paging aside.
func (f AuditFilter) Match(e *AuditEntry) bool {
	return (f.Subject == "" || e.Subject == f.Subject) && (f.Action == "" || e.Action == f.Action) &&
		(f.Outcome == "" || e.Outcome == f.Outcome) && (f.EntryPoint == "" || e.EntryPoint == f.EntryPoint) &&
		(f.Chain == "" || e.Chain == f.Chain)
}

// Scan is the walk of the store that f's listing (newest first) or export
// (oldest first) takes.
func (f AuditFilter) Scan(oldest bool) store.AuditScan {
	return store.AuditScan{Since: f.Since, Until: f.Until, After: f.Cursor, Oldest: oldest}
}

// Values is f as the query of GET /v1/audit.
func (f AuditFilter) Values() url.Values {
	q := url.Values{}
	if !f.Since.IsZero() {
		q.Set("since", f.Since.Format(time.RFC3339Nano))
	}
	if !f.Until.IsZero() {
		q.Set("until", f.Until.Format(time.RFC3339Nano))
	}
	setIf(q, "subject", f.Subject)
	setIf(q, "action", f.Action)
	setIf(q, "outcome", f.Outcome)
	setIf(q, "entry_point", f.EntryPoint)
	setIf(q, "chain", f.Chain)
	setIf(q, "cursor", f.Cursor)
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	return q
}

// ParseAuditFilter reads an audit filter from a request's query.
func ParseAuditFilter(q url.Values) (AuditFilter, error) {
	f := AuditFilter{Subject: q.Get("subject"), Action: q.Get("action"), Outcome: q.Get("outcome"), EntryPoint: q.Get("entry_point"), Chain: q.Get("chain"), Cursor: q.Get("cursor")}
	var err error
	if f.Since, err = ParseSince(q.Get("since")); err != nil {
		return f, err
	}
	if v := q.Get("until"); v != "" {
		if f.Until, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return f, BadRequest("invalid_parameter", "until %q is not an RFC 3339 time", v)
		}
	}
	if f.Cursor != "" {
		if _, ok := store.IDTime(f.Cursor); !ok {
			return f, BadRequest("invalid_parameter", "cursor %q is not one a listing of the audit log gave", f.Cursor)
		}
	}
	switch f.Outcome {
	case "", store.AuditOK, store.AuditDenied, store.AuditFailed:
	default:
		return f, BadRequest("invalid_parameter", "outcome %q is none of %s, %s, %s", f.Outcome, store.AuditOK, store.AuditDenied, store.AuditFailed)
	}
	f.Limit, err = ParseLimit(q.Get("limit"))
	return f, err
}

// ListAuditIn reads a page of st's audit log that f selects.
func ListAuditIn(ctx context.Context, st store.Store, f AuditFilter) (AuditPage, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultAuditLimit
	}
	page := AuditPage{Entries: []*AuditEntry{}}
	err := st.WalkAudit(ctx, f.Scan(false), func(e *AuditEntry) (bool, error) {
		if !f.Match(e) {
			return true, nil
		}
		if len(page.Entries) == limit {
			page.Next = page.Entries[limit-1].ID
			return false, nil
		}
		page.Entries = append(page.Entries, e)
		return true, nil
	})
	return page, err
}

// ExportAuditIn calls fn with each entry of st's audit log f selects,
// oldest first.
func ExportAuditIn(ctx context.Context, st store.Store, f AuditFilter, fn func(*AuditEntry) error) error {
	f.Cursor = ""
	return st.WalkAudit(ctx, f.Scan(true), func(e *AuditEntry) (bool, error) {
		if !f.Match(e) {
			return true, nil
		}
		return true, fn(e)
	})
}

// ListAudit implements Ops.
func (c *Client) ListAudit(ctx context.Context, f AuditFilter) (AuditPage, error) {
	var out AuditPage
	err := c.do(ctx, http.MethodGet, "/v1/audit", f.Values(), nil, &out)
	return out, err
}

// ExportAudit implements Ops, reading GET /v1/audit/export's JSON lines.
func (c *Client) ExportAudit(ctx context.Context, f AuditFilter, fn func(*AuditEntry) error) error {
	f.Cursor, f.Limit = "", 0
	resp, err := c.request(ctx, http.MethodGet, "/v1/audit/export", f.Values(), nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var e AuditEntry
		if err := jsonx.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("reading the audit log's export: %w", err)
		}
		if err := fn(&e); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading the audit log's export: %w", err)
	}
	return nil
}
