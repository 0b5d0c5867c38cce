package store_test

import (
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
)

func TestIDTime(t *testing.T) {
	before := time.Now().Truncate(time.Millisecond)
	id := store.NewID()
	after := time.Now()
	for _, tc := range []struct {
		id   string
		ok   bool
		when func(time.Time) bool
	}{
		{id, true, func(at time.Time) bool { return !at.Before(before) && !at.After(after) }},
		{"01m81d5kykryvq7j6yjqytysc1", true, func(at time.Time) bool { return at.Year() == 2026 }},
		{"short", false, nil},
		{"!1m81d5kykryvq7j6yjqytysc1", false, nil},
	} {
		at, ok := store.IDTime(tc.id)
		if ok != tc.ok || (ok && !tc.when(at)) {
			t.Errorf("IDTime(%q) = %v, %v", tc.id, at, ok)
		}
	}
}
