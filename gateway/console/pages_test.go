package console

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestNormaliseErrorGroups: messages that differ only in ids, numbers and
// quoted values, wherever the numbers sit, group as one kind on the Now
// page; messages that say different things do not.
func TestNormaliseErrorGroups(t *testing.T) {
	tests := []struct {
		name string
		a, b string
		same bool
	}{
		{name: "a trigger paused twice",
			a:    `trigger "am" is paused (by alice at 2026-11-28T07:27:47Z: maintenance): the delivery is kept here; resume the trigger and replay it`,
			b:    `trigger "am" is paused (by alice at 2026-11-28T09:03:05Z: maintenance): the delivery is kept here; resume the trigger and replay it`,
			same: true},
		{name: "more alerts than max_alerts",
			a:    `the delivery holds 12 alerts, and trigger "am" turns at most max_alerts = 10 of one delivery into runs`,
			b:    `the delivery holds 7 alerts, and trigger "am" turns at most max_alerts = 5 of one delivery into runs`,
			same: true},
		{name: "runs' ids",
			a:    "starting the run: waiting for run 01m8ggssg9348k77xwy77gp8sz, which another gateway is starting: context deadline exceeded",
			b:    "starting the run: waiting for run 01m8ggv570zf47jphe5f8h1e9f, which another gateway is starting: context deadline exceeded",
			same: true},
		{name: "fingerprints and digests",
			a:    "alert 3f2a1b4c5d6e7f80 of group 9c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d: no instance",
			b:    "alert 0a1b2c3d4e5f6071 of group 1234abcd1234abcd1234abcd1234abcd1234abcd: no instance",
			same: true},
		{name: "an upper-case digest", a: "digest 3F2A1B4C5D6E7F80 differs", b: "digest 0A1B2C3D4E5F6071 differs", same: true},
		{name: "UUIDs", a: "request 0b7c6e2e-4f1d-4a5b-9c3e-2f1a0b9c8d7e failed", b: "request 9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b failed", same: true},
		{name: "hosts and codes", a: "db-1: HTTP 503 from web1 after 1.5s", b: "db-12: HTTP 502 from web7 after 30s", same: true},
		{name: "numbers of any length", a: "exit code 1234567", b: "exit code 12345678", same: true},
		{name: "quoted values with quotes in them", a: `label "a \"b\" c" is wrong`, b: `label "x" is wrong`, same: true},
		{name: "ids inside hyphenated names", a: "run-01m8ggssg9348k77xwy77gp8sz stalled", b: "run-01m8ggv570zf47jphe5f8h1e9f stalled", same: true},
		{name: "different causes", a: "connection refused", b: "no route to host"},
		{name: "payload or labels", a: "mapping the payload: <<alert.labels.instance>>: missing value", b: "mapping the labels: <<alert.labels.instance>>: missing value"},
		{name: "words of hex letters alone", a: "a deadbeef value", b: "a cafefeed value"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := normaliseError(tc.a), normaliseError(tc.b)
			if (a == b) != tc.same {
				t.Errorf("same kind %v, want %v:\n%s\n%s", a == b, tc.same, a, b)
			}
		})
	}
}

// TestNormaliseErrorCutsWholeRunes: a long message is cut at 200 runes,
// never inside one.
func TestNormaliseErrorCutsWholeRunes(t *testing.T) {
	got := normaliseError(strings.Repeat("é", 300))
	if !utf8.ValidString(got) || utf8.RuneCountInString(got) != 200 || !strings.HasSuffix(got, "…") {
		t.Errorf("cut to %d runes, valid %v: %q", utf8.RuneCountInString(got), utf8.ValidString(got), got)
	}
}
