package gateway

import (
	"context"
	"log/slog"

	"github.com/chaingate/gateway/chain/store"
	redisstore "github.com/chaingate/gateway/chain/store/redis"
)

func openRedis(ctx context.Context, url string, log *slog.Logger) (store.Store, error) {
	return redisstore.OpenURL(ctx, url, log)
}
