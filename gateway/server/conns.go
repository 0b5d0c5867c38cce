package server

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/gateway/server/internal/connguard"
)

// httpServer is the API's HTTP server, with the timeouts of lim: a client
// that sends its request slowly, reads its answer slowly or keeps an idle
// connection is cut off instead of holding it.
func (s *Server) httpServer(lim chain.Limits) *http.Server {
	request := time.Duration(lim.RequestTimeoutSeconds) * time.Second
	return &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: min(request, 10*time.Second),
		ReadTimeout:       request,
		WriteTimeout:      request,
		IdleTimeout:       time.Duration(lim.IdleTimeoutSeconds) * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connguard.ConnKey{}, c)
		},
	}
}
