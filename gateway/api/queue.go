package api

import (
	"slices"
	"strings"
	"time"

	"github.com/chaingate/gateway/chain/store"
)

// QueuePlace is where a queued run waits for its concurrency key: the key,
// its place in the key's queue (1 first), the runs holding the key when it
// last asked, and since when it waits.
type QueuePlace struct {
	Key        string    `json:"key"`
	Position   int       `json:"position"`
	WaitingFor []string  `json:"waiting_for"`
	Since      time.Time `json:"since"`
}

func QueuePlaceOf(q *store.QueuePlace) *QueuePlace {
	if q == nil {
		return nil
	}
	waiting := slices.Clone(q.WaitingFor)
	if waiting == nil {
		waiting = []string{}
	}
	return &QueuePlace{Key: q.Key, Position: q.Position, WaitingFor: waiting, Since: q.Since}
}

// StatusList writes statuses as messages list them: "a, b, c".
func StatusList(statuses []store.RunStatus) string {
	out := make([]string, len(statuses))
	for i, s := range statuses {
		out[i] = string(s)
	}
	return strings.Join(out, ", ")
}
