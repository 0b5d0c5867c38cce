package store

import (
	"context"
	"strings"
	"time"
)

// Statuses a run has that concern its concurrency key (see Slots).
const (
	// RunQueued is a run waiting in its concurrency key's queue for a
	// slot; it has not ended, and has not taken a step yet.
	RunQueued RunStatus = "queued"
	// RunSkipped is a run that ended without taking a step because its
	// concurrency key was taken (on_busy = "skip") or its queue was full.
	RunSkipped RunStatus = "skipped"
)

// RunStatuses are every status a run has, in the order listings show them.
var RunStatuses = []RunStatus{RunQueued, RunRunning, RunWaiting, RunSucceeded, RunFailed, RunCancelled, RunTimedOut, RunSkipped}

// FinalRunStatuses are the statuses a run ends with, in the order the
// stores keep their finished indexes (a new one goes at the end).
var FinalRunStatuses = []RunStatus{RunSucceeded, RunFailed, RunCancelled, RunTimedOut, RunSkipped}

// Events of a run's concurrency key.
const (
	// EventRunQueued is a run entering its key's queue; Data is its
	// QueuePlace.
	EventRunQueued EventType = "run_queued"
	// EventRunDequeued is a queued run taking its slot and starting.
	EventRunDequeued EventType = "run_dequeued"
	// EventRunSkipped is a run ending skipped.
	EventRunSkipped EventType = "run_skipped"
)

// QueuePlace is where a queued run waits.
type QueuePlace struct {
	// Key is the concurrency key as rendered.
	Key string `json:"key"`
	// Position is the run's place in the key's queue, 1 first, when it
	// was last checked.
	Position int `json:"position"`
	// WaitingFor are the holders of the key's slots then: run ids, or
	// RUN/STEP for a step's key.
	WaitingFor []string `json:"waiting_for"`
	// Since is when the run entered the queue.
	Since time.Time `json:"since"`
}

// Slots is implemented by a store that keeps concurrency slots: at most
// Limit holders of one key at once, and a FIFO queue of those waiting for
// it. A holder is a run id, or RUN/STEP for a step's key: a slot belongs
// to a run, not to a gateway, so a run taken over by another gateway
// keeps its slot. A slot is given back by ReleaseSlot, or found free by
// the next AcquireSlot of its key once its run is no longer unfinished
// (ended, or deleted): there is no timer that can expire under a live
// holder.
type Slots interface {
	// AcquireSlot grants the holder a slot of req.Key, atomically, when
	// fewer than req.Limit hold one and no one is queued before it (the
	// holder already holding one is granted again). Otherwise, with
	// req.Queue, it puts the holder at the end of the key's queue unless
	// it is queued already (or the queue holds req.QueueLimit, when above
	// zero: then Full); without, it leaves the queue as it is and removes
	// the holder from it.
	AcquireSlot(ctx context.Context, req SlotRequest) (SlotGrant, error)
	// ReleaseSlot gives up the holder's slot of key, or its place in the
	// key's queue; one it holds neither of is no error.
	ReleaseSlot(ctx context.Context, key, holder string) error
	// ListSlots returns every key held or queued for, by key, its holders
	// and queue as of now (those of runs that ended left out).
	ListSlots(ctx context.Context) ([]SlotState, error)
}

// SlotRequest asks for a slot of a concurrency key.
type SlotRequest struct {
	Key    string
	Holder string
	// Limit is how many may hold the key at once; at least 1.
	Limit int
	// Queue keeps the holder in the key's queue when it is not granted.
	Queue bool
	// QueueLimit bounds the queue; 0 leaves it unbounded.
	QueueLimit int
}

// SlotGrant is AcquireSlot's answer.
type SlotGrant struct {
	Granted bool
	// Position is the holder's place in the queue, 1 first, when it was
	// not granted and is queued.
	Position int
	// Full says the queue held QueueLimit, and the holder was not queued.
	Full bool
	// Holders are the key's holders, in the order they were granted.
	Holders []string
}

// SlotState is one key's holders and queue.
type SlotState struct {
	Key     string   `json:"key"`
	Holders []string `json:"holders"`
	Queue   []string `json:"queue"`
}

// SlotRun is the run a slot's holder is: a run id, or RUN/STEP.
func SlotRun(holder string) string {
	run, _, _ := strings.Cut(holder, "/")
	return run
}

// Acquire applies req to st, a key's state as a store keeps it, for a
// store that changes it under one lock or transaction: holders and queued
// holders whose run alive says is no longer unfinished are dropped first.
func (st *SlotState) Acquire(req SlotRequest, alive func(runID string) bool) SlotGrant {
	st.Prune(alive)
	limit := max(req.Limit, 1)
	holders := func() []string { return append([]string(nil), st.Holders...) }
	if containsString(st.Holders, req.Holder) {
		return SlotGrant{Granted: true, Holders: holders()}
	}
	at := indexString(st.Queue, req.Holder)
	if len(st.Holders) < limit && (len(st.Queue) == 0 || at == 0) {
		if at == 0 {
			st.Queue = st.Queue[1:]
		}
		st.Holders = append(st.Holders, req.Holder)
		return SlotGrant{Granted: true, Holders: holders()}
	}
	if at < 0 {
		if !req.Queue {
			return SlotGrant{Holders: holders()}
		}
		if req.QueueLimit > 0 && len(st.Queue) >= req.QueueLimit {
			return SlotGrant{Full: true, Holders: holders()}
		}
		st.Queue = append(st.Queue, req.Holder)
		at = len(st.Queue) - 1
	} else if !req.Queue {
		st.Queue = append(st.Queue[:at], st.Queue[at+1:]...)
		return SlotGrant{Holders: holders()}
	}
	return SlotGrant{Position: at + 1, Holders: holders()}
}

// Release takes holder out of st's holders and queue.
func (st *SlotState) Release(holder string) {
	if i := indexString(st.Holders, holder); i >= 0 {
		st.Holders = append(st.Holders[:i], st.Holders[i+1:]...)
	}
	if i := indexString(st.Queue, holder); i >= 0 {
		st.Queue = append(st.Queue[:i], st.Queue[i+1:]...)
	}
}

// Prune drops the holders and queued holders whose runs have ended.
func (st *SlotState) Prune(alive func(runID string) bool) {
	keep := func(list []string) []string {
		out := list[:0]
		for _, h := range list {
			if alive(SlotRun(h)) {
				out = append(out, h)
			}
		}
		return out
	}
	st.Holders, st.Queue = keep(st.Holders), keep(st.Queue)
}

// Empty reports whether no one holds the key or waits for it.
func (st *SlotState) Empty() bool { return len(st.Holders) == 0 && len(st.Queue) == 0 }

func indexString(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

func containsString(list []string, s string) bool { return indexString(list, s) >= 0 }
