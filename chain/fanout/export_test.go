package fanout

import (
	"context"

	"github.com/chaingate/gateway/chain/fanout/internal/broker"
)

// ItemsReady is how many messages wait in the items queue, not counting
// those delivered and not yet acknowledged.
func (f *Fanout) ItemsReady(ctx context.Context) (int, error) {
	return f.broker.Depth(ctx, broker.Items)
}
