// Package chain holds the chain model: chains, steps and providers as a
// config defines them, with their templates and conditions compiled, and
// where each was written. Package loader builds it from TOML.
//
// It is the gateway's own package, with no compatibility promise.
package chain

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"time"

	"github.com/chaingate/gateway/chain/internal/condition"
	"github.com/chaingate/gateway/templates"
)

// Config is everything loaded from one set of config files.
type Config struct {
	Gateway   Gateway
	Providers map[string]*Provider
	Chains    map[string]*Chain
	Triggers  map[string]*Trigger
	Schedules map[string]*Schedule
	// ChainNames, ProviderNames and TriggerNames keep definition order for
	// listings.
	ChainNames    []string
	ProviderNames []string
	TriggerNames  []string
	ScheduleNames []string
	// Warnings are problems that do not stop the config from loading.
	Warnings []Diagnostic
}

// Source says where a definition came from.
type Source struct {
	File string
	Line int
	Col  int
	// Path is the key path, e.g. chains[incident-response].steps[notify].
	Path string

	// Kept so that Key can place a diagnostic on a key inside the table.
	pos Positions
	kp  KeyPath
}

// Key is the source of the key below s's table that rel names, written as
// template errors write keys ("config.headers.Authorization", "blocks[0]"),
// so a problem found after loading points at the key itself; where that key
// was not written out, at the nearest enclosing one that was.
func (s Source) Key(rel string) Source {
	if s.pos == nil {
		return Source{File: s.File, Line: s.Line, Col: s.Col, Path: s.Path + "." + rel}
	}
	return SourceAt(s.File, s.pos, s.kp.Sub(rel))
}

// Gateway is the [gateway] table.
type Gateway struct {
	Listen string
	// State is the store URL: bolt://PATH (default) or redis://HOST:PORT/DB.
	// Like the broker URLs of Fanout, it may read secrets (a password) as
	// <<secrets.NAME>>, filled in when the store is opened.
	State  string
	Limits Limits
	Auth   Auth
	// SecretsFile holds NAME=VALUE lines for <<secrets.NAME>>.
	SecretsFile string
	// LeaseTTLSeconds is how long a run stays leased to a gateway that
	// stopped renewing it before another takes it over.
	LeaseTTLSeconds int
	// ShutdownGraceSeconds is how long SIGTERM waits for calls in flight.
	ShutdownGraceSeconds int
	// ExternalURL is the address people reach the gateway at
	// (https://gw.example.com), without a trailing slash: where links in
	// messages point. Empty when the config does not say.
	ExternalURL string
	// Fanout is the [gateway.fanout] table; nil when the config has none,
	// and every split runs in the gateway that runs its chain.
	Fanout *Fanout
	UI     UI
	// Slack is the [gateway.slack] table; nil without one, and Slack's
	// interaction callbacks are refused.
	Slack *Slack
	// Retention is the [gateway.retention] table, defaults filled in.
	Retention Retention
	// Source is where the [gateway] table was written; zero without one.
	Source Source
}

// UI is the [gateway.ui] table: the web console that serve answers.
type UI struct {
	// Disabled turns the console off (enabled = false).
	Disabled bool
	// BasePath is where the console is served, "/ui" by default; behind a
	// reverse proxy that adds a prefix, the prefix with it.
	BasePath string
	// ReadOnly shows no write actions, and refuses them, whatever the
	// token.
	ReadOnly bool
	// OIDC signs people in through an OpenID Provider; nil: token sign-in
	// only.
	OIDC *OIDC
}

// OIDC is [gateway.ui.oidc]: the OpenID Provider the console signs people
// in through, with the authorization code flow and PKCE.
type OIDC struct {
	// Issuer is the provider's issuer URL, where its discovery document is.
	Issuer   string
	ClientID string
	// ClientSecret names the secret that holds the client's secret.
	ClientSecret string
	Scopes       []string
	// UsernameClaim and GroupsClaim name the claims a person's name and
	// groups are read from.
	UsernameClaim, GroupsClaim string
	// SessionTTL is how long a console session lasts once signed in.
	SessionTTL time.Duration
	// AllowTokens keeps token sign-in beside the provider's.
	AllowTokens bool
	Source      Source
}

// OIDC's defaults.
const (
	DefaultUsernameClaim = "preferred_username"
	DefaultGroupsClaim   = "groups"
	DefaultSessionTTL    = 12 * time.Hour
)

// DefaultOIDCScopes are the scopes asked for unless the config says.
var DefaultOIDCScopes = []string{"openid", "profile", "email"}

// DefaultUIBasePath is where the console is served unless [gateway.ui]
// base_path says otherwise.
const DefaultUIBasePath = "/ui"

// RunURL is the console page of run id as people reach it at ExternalURL;
// "" when there is no such page: no external_url, or no console.
func (g *Gateway) RunURL(id string) string {
	if g.ExternalURL == "" || g.UI.Disabled {
		return ""
	}
	base := g.UI.BasePath
	if base == "" {
		base = DefaultUIBasePath
	}
	return g.ExternalURL + base + "/runs/" + url.PathEscape(id)
}

// Slack is the [gateway.slack] table: approval answers given with the
// buttons of a Slack message, which Slack posts to the gateway.
type Slack struct {
	// SigningSecret names the secret that holds the Slack app's signing
	// secret, which signs every request Slack sends.
	SigningSecret string
	// Users maps Slack user IDs to who they are in the gateway's records;
	// a user it does not name may not answer.
	Users map[string]string
	// ResponseURLHosts are the hosts an interaction's response_url may
	// name for the gateway to post to (lower case); nil is Slack's own,
	// DefaultSlackResponseURLHosts.
	ResponseURLHosts []string
	// Source is where the table was written.
	Source Source
}

// DefaultSlackResponseURLHosts are the hosts of Slack's own response URLs.
var DefaultSlackResponseURLHosts = []string{"hooks.slack.com"}

// Fanout is the [gateway.fanout] table: where distributed splits hand their
// items to workers (RabbitMQ) and collect their results (Redis).
type Fanout struct {
	// RabbitMQURL is the broker, amqp://USER:PASS@HOST:PORT/VHOST.
	RabbitMQURL string
	// RedisURL is where item results meet, redis://HOST:PORT/DB.
	RedisURL string
	// Prefix names this deployment's queues and keys, so several share a
	// broker and a Redis.
	Prefix string
	// Threshold is the item count at and above which a split in auto mode
	// is distributed.
	Threshold int
	// BatchSize is how many items one message carries.
	BatchSize int
	// MaxInFlight bounds the items of one split published and not yet done.
	MaxInFlight int
	// ItemTimeoutSeconds is how long one item may hold a worker before it
	// counts as timed out.
	ItemTimeoutSeconds int
	// MaxRedeliveries is how often a message may be delivered again after
	// its worker went away before its items are parked as poison.
	MaxRedeliveries int
	// Prefetch is how many messages a worker holds unacknowledged.
	Prefetch int
	// WorkerConcurrency is how many items a worker runs at once.
	WorkerConcurrency int
	// ClaimTTLSeconds is how long a worker's claim on an item lasts unless
	// renewed: how long an item whose worker died waits before another
	// takes it over.
	ClaimTTLSeconds int
}

// Defaults for [gateway.fanout].
const (
	DefaultFanoutPrefix             = "chaingate."
	DefaultFanoutThreshold          = 1000
	DefaultFanoutBatchSize          = 500
	DefaultFanoutMaxInFlight        = 20_000
	DefaultFanoutItemTimeoutSeconds = 300
	DefaultFanoutMaxRedeliveries    = 5
	DefaultFanoutPrefetch           = 8
	DefaultFanoutWorkerConcurrency  = 256
	DefaultFanoutClaimTTLSeconds    = 15
)

// Auth is the [gateway.auth] table. Tokens may also come from the
// environment (CHAINGATE_API_TOKENS and CHAINGATE_API_READ_TOKENS, comma
// separated; CHAINGATE_API_TOKEN_NAME and CHAINGATE_API_READ_TOKEN_NAME,
// one named token each), and a token written here may read a secret, so
// none needs to be written in a config file.
type Auth struct {
	// Tokens may do anything, unless they name roles.
	Tokens []Token
	// ReadTokens may only read (GET), unless they name roles.
	ReadTokens []Token
	// Roles are the roles [gateway.auth.roles] defines, by name.
	Roles map[string]*Role
	// Users gives people roles by the name they sign in or answer under
	// ([gateway.auth.users]).
	Users map[string][]string
	// Groups gives the members of a sign-in group roles
	// ([gateway.auth.groups]).
	Groups map[string][]string
	// Source is where [gateway.auth] is written.
	Source Source
}

// Built-in roles, which a config may give but not define.
const (
	// RoleAdmin may do every action on everything: what a full token may do
	// without roles.
	RoleAdmin = "admin"
	// RoleReader may read everything: what a read token may do without
	// roles.
	RoleReader = "reader"
	// RoleApprover may read and answer approvals of every chain: what a
	// Slack user may do when the config defines no roles.
	RoleApprover = "approver"
)

// Action is what a subject may be granted, and asks, to do.
type Action string

// The actions a role may grant.
const (
	ActionRead    Action = "read"    // list and show runs, chains, the DLQ, schedules, metrics
	ActionStart   Action = "start"   // start a run of a chain
	ActionDeliver Action = "deliver" // deliver an alert or a webhook to a trigger
	ActionApprove Action = "approve" // answer an approval step
	ActionCancel  Action = "cancel"  // cancel a run
	ActionReplay  Action = "replay"  // replay a run or a dead-letter entry
	ActionRedrive Action = "redrive" // run a split's failed items again
	ActionPause   Action = "pause"   // pause or resume a trigger or a schedule
	ActionDelete  Action = "delete"  // delete runs or dead-letter entries, prune
	ActionBackup  Action = "backup"  // take a backup of the store
	ActionAdmin   Action = "admin"   // reload the config, read the audit log
)

// Actions lists every action, in the order above.
var Actions = []Action{ActionRead, ActionStart, ActionDeliver, ActionApprove, ActionCancel, ActionReplay, ActionRedrive, ActionPause, ActionDelete, ActionBackup, ActionAdmin}

// Role is one role of [gateway.auth.roles]: what its holders may do.
type Role struct {
	Name   string
	Grants []Grant
	Source Source
}

// Grant is one grant of a role: actions on the chains, triggers and
// schedules whose names match its patterns. A grant with no patterns is
// on everything, the gateway itself included.
type Grant struct {
	Actions   []Action
	Chains    []string
	Triggers  []string
	Schedules []string
	Source    Source
}

// Token is one API token of [gateway.auth]: its value as written, or the
// secret that holds it.
type Token struct {
	// Name is who holds the token, so that what is done with it is
	// recorded with who did it; empty for a token without one.
	Name string
	// Value is the token as written; empty when it reads a secret.
	Value string
	// Secret is NAME for a token written as <<secrets.NAME>>: its value
	// is that secret's, which the gateway reads when it starts.
	Secret string
	// Roles are the roles the token's holder has; none leaves a full token
	// every action and a read token reading.
	Roles []string
	// Source is where the token is written, so that a secret it reads and
	// the gateway lacks is reported there.
	Source Source
}

// Limits bound what one run may hold, so that a runaway input fails with a
// clear error instead of exhausting memory.
type Limits struct {
	// MaxSplitItems bounds the array a split step loops over.
	MaxSplitItems int
	// MaxBodyBytes bounds a step's body: a provider's answer, a split's
	// collected results, a sub-chain's result.
	MaxBodyBytes int
	// MaxRequestBytes bounds an API request body.
	MaxRequestBytes int
	// MaxConnections bounds the API's open connections; past it, a
	// connection may only ask for the health checks, and is refused the rest.
	MaxConnections int
	// MaxConnectionsPerAddress bounds the connections one remote address
	// (an IPv6 client's /64) holds, so one client cannot take every slot.
	MaxConnectionsPerAddress int
	// RequestTimeoutSeconds bounds reading a request and writing its answer,
	// so a slow client cannot hold a connection. Event streams and
	// ?wait= requests are bounded by what they wait for instead.
	RequestTimeoutSeconds int
	// IdleTimeoutSeconds closes a kept-alive connection with no request.
	IdleTimeoutSeconds int
}

// Defaults for [gateway.limits].
const (
	DefaultMaxSplitItems   = 100_000
	DefaultMaxBodyBytes    = 16 << 20
	DefaultMaxRequestBytes = 1 << 20
	DefaultMaxConnections  = 1024
	DefaultMaxConnsPerAddr = 128
	DefaultRequestTimeout  = 30
	DefaultIdleTimeout     = 60
)

// Provider is one [[providers]] entry.
type Provider struct {
	Name string
	// Type is a built-in provider type; exactly one of Type and Plugin is set.
	Type string
	// Plugin is the path of an external plugin binary.
	Plugin string
	// SHA256 pins Plugin to one binary.
	SHA256         string
	TimeoutSeconds int
	// RateLimit paces calls to the provider; nil means unpaced.
	RateLimit *RateLimit
	// MaxConcurrency bounds the calls in flight to the provider; 0 means
	// unbounded.
	MaxConcurrency int
	// CircuitBreaker stops calling a failing provider for a while; nil
	// means never.
	CircuitBreaker *CircuitBreaker
	// Config is the opaque [providers.config] table as JSON.
	Config []byte
	// ConfigTemplate is set when the config reads <<secrets.NAME>>; it is
	// rendered when the provider is called, so secrets never sit in Config.
	ConfigTemplate *templates.Template
	Source         Source
	// Raw is the table as written, to write the definition out again.
	Raw map[string]any
}

// Chain is one [[chains]] entry.
type Chain struct {
	Name           string
	TimeoutSeconds int
	// Input is what the chain declares its origin payload holds; nil when
	// it declares nothing and takes any payload.
	Input *Input
	// Retention is what the chain's retention table sets; nil without one.
	// It is not part of the definition a run keeps: changing it changes
	// how long runs are kept, not what they run.
	Retention *RetentionOverride
	Steps     []*Step
	// Hash identifies this exact definition, sub-chains and providers
	// included: it is the SHA-256 of what Config.Definition returns. A run
	// records the hash it started with.
	Hash   string
	Source Source

	// Raw is the table as written, to write the definition out again.
	Raw    map[string]any
	byName map[string]*Step
	// definition is Config.Definition's document, made once at load.
	definition []byte
	// providers is Config.ProvidersUsed, worked out once at load.
	providers []string
	// Concurrency is the chain's concurrency table; nil without one.
	Concurrency *Concurrency

	// OnFailure are the steps run when the run fails (not when it is
	// cancelled, nor when a catch route recovered it); Finally those run
	// whatever the outcome (on cancel too, with FinallyOnCancel). See
	// failure.go.
	OnFailure, Finally []*Step
	// FinallyOnCancel runs Finally when the run is cancelled; default true.
	FinallyOnCancel bool
	// HandlersTimeoutSeconds bounds the on_failure and finally steps of one
	// run together.
	HandlersTimeoutSeconds int
}

// ChainHint suggests the defined chain nearest to name, for an error about
// an unknown one: ` (did you mean "x"?)`, or "".
func (c *Config) ChainHint(name string) string {
	if s := Suggest(name, c.ChainNames); s != "" {
		return fmt.Sprintf(" (did you mean %q?)", s)
	}
	return ""
}

// Step returns the step with that name anywhere in the chain, including
// parallel sub-steps and split per-item steps.
func (c *Chain) Step(name string) *Step { return c.byName[name] }

// StepKind says what a step does.
type StepKind int

const (
	KindProvider StepKind = iota + 1
	KindParallel
	KindSplit
	KindSubChain
	KindApproval
)

func (k StepKind) String() string {
	switch k {
	case KindProvider:
		return "provider"
	case KindParallel:
		return "parallel"
	case KindSplit:
		return "split"
	case KindSubChain:
		return "sub_chain"
	case KindApproval:
		return "approval"
	}
	return "unknown"
}

// OnFailure is a step's failure policy.
type OnFailure string

const (
	OnFailureAbort OnFailure = "abort"
	OnFailureSkip  OnFailure = "skip"
	OnFailureDLQ   OnFailure = "dlq"
)

// Step is one step of a chain, a parallel group, or a split's per-item chain.
type Step struct {
	Name string
	Kind StepKind

	Provider   string
	ActionType string
	Payload    *templates.Template

	OnFailure      OnFailure
	TimeoutSeconds int
	DelaySeconds   int
	Retry          *Retry
	When           *condition.Expr
	DefaultNext    string
	Branches       []*Branch

	Parallel *Parallel
	Split    *Split
	SubChain string
	Input    *templates.Template
	Approval *Approval

	// Index is the step's position in the list that holds it.
	Index int
	// List is the list that holds the step: the chain's steps, a parallel
	// group's sub-steps or a split's per-item steps.
	List []*Step
	// Parent is the parallel or split step holding this one, nil at top level.
	Parent *Step
	Source Source
	// Concurrency is the step's concurrency table; nil without one.
	Concurrency *Concurrency

	// Catch routes the step's failure by class; first match wins. Only a
	// top-level step of the chain's own list has it.
	Catch []*Catch
}

// Next returns the step after s in its list, or nil at the end.
func (s *Step) Next() *Step {
	if s.Index+1 < len(s.List) {
		return s.List[s.Index+1]
	}
	return nil
}

// BackoffStrategy says how retry delays grow.
type BackoffStrategy string

const (
	BackoffFixed       BackoffStrategy = "fixed"
	BackoffLinear      BackoffStrategy = "linear"
	BackoffExponential BackoffStrategy = "exponential"
)

// Retry is a step's retry policy; only retryable errors are retried.
type Retry struct {
	MaxRetries   int
	BackoffMS    int
	Strategy     BackoffStrategy
	MaxBackoffMS int
	JitterMS     int
}

// Branch routes to Target when its condition holds on the step's result.
type Branch struct {
	Cond   condition.Condition
	Target string
	Source Source
}

// Join is a parallel group's join policy.
type Join string

const (
	JoinAll Join = "all"
	JoinAny Join = "any"
)

// GroupFailure is a parallel group's failure policy.
type GroupFailure string

const (
	GroupFailFast   GroupFailure = "fail_fast"
	GroupBestEffort GroupFailure = "best_effort"
)

// DefaultParallelTimeoutSeconds bounds a parallel group without its own timeout.
const DefaultParallelTimeoutSeconds = 300

// Parallel is a fan-out/fan-in group.
type Parallel struct {
	Join           Join
	OnFailure      GroupFailure
	TimeoutSeconds int
	// MaxConcurrency is 0 when unbounded.
	MaxConcurrency int
	Steps          []*Step
}

// SplitMode says where a split's items run.
type SplitMode string

const (
	// SplitAuto distributes a split of at least [gateway.fanout].threshold
	// items when the gateway has a broker, and runs it locally otherwise.
	SplitAuto SplitMode = "auto"
	// SplitLocal runs every item in the gateway that runs the chain.
	SplitLocal SplitMode = "local"
	// SplitDistributed hands the items to workers over RabbitMQ.
	SplitDistributed SplitMode = "distributed"
)

// Split runs its per-item steps once for every element of Items.
type Split struct {
	Items *templates.Template
	// Mode is where the items run; default auto.
	Mode           SplitMode
	MaxConcurrency int
	// ToleratedFailures is a count, or a percentage of the items when
	// ToleratedPercent is set.
	ToleratedFailures int
	ToleratedPercent  bool
	TimeoutSeconds    int
	Steps             []*Step
}

// Tolerated returns how many failed items a split of total items tolerates.
func (s *Split) Tolerated(total int) int {
	if s.ToleratedPercent {
		return total * s.ToleratedFailures / 100
	}
	return s.ToleratedFailures
}

// WalkSteps calls fn for every step, nested ones included, in order.
func WalkSteps(steps []*Step, fn func(*Step)) {
	for _, s := range steps {
		fn(s)
		if s.Parallel != nil {
			WalkSteps(s.Parallel.Steps, fn)
		}
		if s.Split != nil {
			WalkSteps(s.Split.Steps, fn)
		}
	}
}

// Seal finishes a loaded config: it indexes each chain's steps by name and
// sets its Hash from the definition a run of it stores, so that changing a
// sub-chain or a provider it uses changes the hash too (a store keeps the
// first definition saved under a hash).
func (c *Config) Seal() error {
	for _, name := range c.ChainNames {
		ch := c.Chains[name]
		ch.byName = map[string]*Step{}
		ch.WalkChain(func(s *Step) { ch.byName[s.Name] = s })
		def, err := c.definition(name, true)
		if err != nil {
			return fmt.Errorf("hashing chain %q: %w", name, err)
		}
		sum := sha256.Sum256(def)
		ch.Hash = hex.EncodeToString(sum[:])
		ch.definition = def
		ch.providers = c.ProvidersUsed(name)
	}
	return nil
}

// EndTarget is the branch and default_next target that ends the list: the
// run at top level (it succeeds), the item inside a split (it is skipped).
const EndTarget = "end"

// DefaultProviderTimeoutSeconds bounds a provider call when neither the step
// nor the provider sets timeout_seconds.
const DefaultProviderTimeoutSeconds = 30

// Approval is an approval step: the run waits, durably, until a person
// answers approve or reject, or until the step's timeout_seconds.
type Approval struct {
	// Message says what is asked, rendered when the step starts.
	Message *templates.Template
	// OnTimeout is what no answer within timeout_seconds means: approve,
	// reject, or fail (the step times out and on_failure applies).
	OnTimeout string
	// OnReject is what a reject does: fail the step (on_failure applies),
	// or continue, the step succeeding with the decision for branches.
	OnReject string
	// OnResolve is what the resolution of the alert whose firing started
	// the run does to the step while it waits: cancel the run, approve or
	// reject; empty leaves the question standing.
	OnResolve string
	// Notify tells people the step asks, when it starts waiting and every
	// Notify.Every after (reminders); Escalate calls once, Escalate.After
	// the step asked, while it still waits. Nil when not set.
	Notify, Escalate *ApprovalCall
	// Approvers are who may answer: people by name, groups as
	// "group:NAME"; none leaves it to whoever may approve the chain.
	Approvers []string
	// FourEyes refuses an answer from whoever started the run.
	FourEyes bool
}

// GroupPrefix marks a group among an approval step's approvers.
const GroupPrefix = "group:"

// ApprovalCall is a provider call an approval step makes while it waits.
// Its payload reads approval (step, message, asked_at, deadline, url,
// reminder), origin (payload) and run (id, chain, url, labels).
type ApprovalCall struct {
	Provider   string
	ActionType string
	Payload    *templates.Template
	// Every repeats a notification as a reminder; After delays an
	// escalation. Zero: never, and at once.
	Every, After time.Duration
	Source       Source
}

// ApprovalCallRoots are what an approval call's payload reads.
var ApprovalCallRoots = []string{"approval", "origin", "run"}

// Approval decisions.
const (
	DecisionApprove = "approve"
	DecisionReject  = "reject"
)
