package engine

import "context"

type actorKey struct{}

// WithActor says who acts through ctx, such as an API token's name or a
// console user's: cancels and replays record it in the run's events.
func WithActor(ctx context.Context, who string) context.Context {
	return context.WithValue(ctx, actorKey{}, who)
}

// Actor is who ctx says acts, or "".
func Actor(ctx context.Context) string {
	who, _ := ctx.Value(actorKey{}).(string)
	return who
}

// by is " by WHO" for the actor ctx carries, or "".
func by(ctx context.Context) string {
	if who := Actor(ctx); who != "" {
		return " by " + who
	}
	return ""
}
