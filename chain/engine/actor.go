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

type identityKey struct{}

// Identity is who acts, as the gateway's authorization proved them: a run
// records who started it, and an approval step that names its approvers or
// asks for four eyes checks who answers.
type Identity struct {
	Name   string
	Groups []string
}

// WithIdentity is ctx saying id acts.
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// IdentityOf is who ctx says acts, if it says.
func IdentityOf(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// startedBy is who ctx says starts a run, for its origin.
func startedBy(ctx context.Context) string {
	id, _ := IdentityOf(ctx)
	return id.Name
}

// Acting is ctx saying id acts, through via (API, console, Slack…): its
// runs record id as who started them, its answers are checked as id's, and
// its events name "NAME (via)".
func Acting(ctx context.Context, id Identity, via string) context.Context {
	who := id.Name
	if via != "" {
		who += " (" + via + ")"
	}
	return WithActor(WithIdentity(ctx, id), who)
}
