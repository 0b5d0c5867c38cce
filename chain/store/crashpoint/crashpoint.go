// Package crashpoint kills the gateway's own process, as kill -9 would, at
// a chosen commit of a run, so that tests of crash safety stop a real
// gateway exactly where they mean to instead of sleeping and hoping. It is
// armed only by the CHAINGATE_CRASH_AT environment variable; unset, the
// store is used as it is.
//
// Every state a run can be found in after a crash lies on a commit
// boundary, so a point is named by the commit it sits at:
//
//	create                 once a run's first commit is durable: the run exists, nothing was called
//	before KEY STATUS      in place of the first commit that writes step KEY with STATUS: it never lands
//	after KEY STATUS       once that commit is durable, before anything acts on it
//
// KEY is a step record's key as the store holds it ("notify/sub-03",
// "loop[05]", "loop[05]/check"), STATUS a step status ("running",
// "pending", "succeeded", ...). The first commit that matches, of any run,
// is the one.
//
// It is the gateway's own package, with no compatibility promise.
package crashpoint

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/chaingate/gateway/chain/store"
)

// Env names the variable that arms a crash point.
const Env = "CHAINGATE_CRASH_AT"

// Point is where to crash.
type Point struct {
	When   When
	Key    string
	Status store.StepStatus
}

// When says on which side of its commit a point sits.
type When string

const (
	Create When = "create"
	Before When = "before"
	After  When = "after"
)

// Parse reads a point as Env spells it.
func Parse(spec string) (Point, error) {
	f := strings.Fields(spec)
	switch {
	case len(f) == 1 && f[0] == string(Create):
		return Point{When: Create}, nil
	case len(f) == 3 && (f[0] == string(Before) || f[0] == string(After)):
		p := Point{When: When(f[0]), Key: f[1], Status: store.StepStatus(f[2])}
		if !knownStatus(p.Status) {
			return Point{}, fmt.Errorf("parsing %s=%q: unknown step status %q (want pending, running, succeeded, failed, skipped, timed_out or cancelled)", Env, spec, f[2])
		}
		return p, nil
	}
	return Point{}, fmt.Errorf("parsing %s=%q: want \"create\", \"before KEY STATUS\" or \"after KEY STATUS\"", Env, spec)
}

func knownStatus(s store.StepStatus) bool {
	switch s {
	case store.StepPending, store.StepRunning, store.StepSucceeded, store.StepFailed, store.StepSkipped, store.StepTimedOut, store.StepCancelled:
		return true
	}
	return false
}

// FromEnv wraps st so that the process dies at the point Env names; with
// Env unset it returns st itself.
func FromEnv(st store.Store) (store.Store, error) {
	spec, ok := os.LookupEnv(Env)
	if !ok {
		return st, nil
	}
	p, err := Parse(spec)
	if err != nil {
		return nil, err
	}
	return Wrap(st, p, killSelf), nil
}

// Wrap returns st with die called at p instead of going on.
func Wrap(st store.Store, p Point, die func()) store.Store {
	return &crashStore{Store: st, p: p, die: die}
}

type crashStore struct {
	store.Store
	p   Point
	die func()
}

func (s *crashStore) Commit(ctx context.Context, b *store.Batch) error {
	hit := s.p.matches(b)
	if hit && s.p.When == Before {
		s.die()
	}
	err := s.Store.Commit(ctx, b)
	if hit && err == nil && s.p.When != Before {
		s.die()
	}
	return err
}

func (p Point) matches(b *store.Batch) bool {
	if p.When == Create {
		return b.Create
	}
	for _, rec := range b.Steps {
		if rec.Key == p.Key && rec.Status == p.Status {
			return true
		}
	}
	return false
}

// killSelf ends the process as kill -9 does: no deferred function, no
// flush, no goodbye to the plugins, which notice on their own.
func killSelf() {
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Kill()
	}
	select {}
}
