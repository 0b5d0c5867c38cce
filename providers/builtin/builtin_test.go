package builtin_test

import (
	"context"
	"slices"
	"testing"

	"github.com/chaingate/gateway/providers/builtin"
)

func TestRegistry(t *testing.T) {
	if got, want := builtin.Types(), []string{"echo", "faulty", "http"}; !slices.Equal(got, want) {
		t.Errorf("Types() = %v, want %v", got, want)
	}
	for _, typ := range builtin.Types() {
		p, ok := builtin.New(typ)
		if !ok {
			t.Fatalf("New(%q) found nothing", typ)
		}
		info, err := p.Describe(context.Background())
		if err != nil || info.Name != typ {
			t.Errorf("New(%q).Describe() = %+v, %v", typ, info, err)
		}
	}
	if _, ok := builtin.New("nope"); ok {
		t.Error(`New("nope") found a provider`)
	}
}
