package store

import (
	"fmt"
	"time"
)

// AuditEntry is one operator action, or one refusal, as the audit log
// keeps it: who, what, on what, from where, and what came of it.
type AuditEntry struct {
	// ID sorts by time (NewID).
	ID   string    `json:"id"`
	Time time.Time `json:"time"`
	// Subject is who acted, as runs record it; SubjectKind how they proved
	// it (token, person, slack, trigger, loopback, cli).
	Subject     string   `json:"subject"`
	SubjectKind string   `json:"subject_kind"`
	Roles       []string `json:"roles,omitempty"`
	Groups      []string `json:"groups,omitempty"`
	// Action is one of the actions roles grant (read, start, approve…).
	Action string `json:"action"`
	// TargetKind and Target name what was acted on (run, chain, trigger,
	// schedule, dlq, gateway); Chain and Trigger are those it belongs to.
	TargetKind string `json:"target_kind"`
	Target     string `json:"target,omitempty"`
	Chain      string `json:"chain,omitempty"`
	Trigger    string `json:"trigger,omitempty"`
	// Run is the run the action started or acted on, when there is one.
	Run string `json:"run,omitempty"`
	// EntryPoint is the way in: api, console, slack, trigger, cli.
	EntryPoint string `json:"entry_point"`
	// Route is the request that asked, such as "POST /v1/runs/{id}/cancel".
	Route   string `json:"route,omitempty"`
	Address string `json:"address,omitempty"`
	// Outcome is ok, denied (by the authorization seam) or failed; Status
	// the HTTP status answered, where there was one.
	Outcome string `json:"outcome"`
	Status  int    `json:"status,omitempty"`
	// Detail says why a refusal or failure happened, or what an answer was.
	Detail string `json:"detail,omitempty"`
}

// Audit outcomes.
const (
	AuditOK     = "ok"
	AuditDenied = "denied"
	AuditFailed = "failed"
)

// AuditScan selects entries of the audit log to walk: those made in
// [Since, Until) (either zero: unbounded), after the entry After in the
// walk's direction, newest first unless Oldest.
type AuditScan struct {
	Since, Until time.Time
	After        string
	Oldest       bool
}

// IDFloor is the smallest id NewID could make at t: every id made at t or
// later sorts at or after it.
func IDFloor(t time.Time) string {
	return encodeID(uint64(t.UnixMilli())<<16, 0)
}

// Bounds are the ids of the entries scan selects: from lo (inclusive)
// to hi (exclusive), "" being unbounded, After already applied.
func (a AuditScan) Bounds() (lo, hi string) {
	if !a.Since.IsZero() {
		lo = IDFloor(a.Since)
	}
	if !a.Until.IsZero() {
		hi = IDFloor(a.Until)
	}
	if a.After != "" {
		if a.Oldest {
			// The next id after After: ids are of one length, so After
			// with a byte below every id character appended sorts just
			// after it.
			if next := a.After + "\x00"; next > lo {
				lo = next
			}
		} else if hi == "" || a.After < hi {
			hi = a.After
		}
	}
	return lo, hi
}

// CheckAudit refuses an entry a store cannot keep and read back.
func CheckAudit(e *AuditEntry) error {
	if _, ok := IDTime(e.ID); !ok {
		return fmt.Errorf("audit entry id %q is not one NewID makes: %w", e.ID, ErrInvalid)
	}
	return nil
}
