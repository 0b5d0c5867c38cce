// Package host is the gateway's side of the plugin protocol: it launches
// provider plugins, restarts the ones that crash, and calls them. It is the
// gateway's own, with no compatibility promise; plugin authors import
// package plugins.
//
// The gateway creates one Manager, gets a providers.Provider per configured
// provider from Manager.Provider, and calls Manager.Close on shutdown.
// Built-in providers are served by the gateway's own binary, re-executed with
// BuiltinEnv set (see ServeBuiltinIfRequested), so they take exactly the
// same path as a team's plugin.
package host

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/chaingate/gateway/plugins/internal/wire"
	"github.com/chaingate/gateway/plugins/proto/providerv1"
	"github.com/chaingate/gateway/providers"
)

// ErrClosed is returned, inside a retryable *providers.Error, by a handle
// whose Manager has been closed.
var ErrClosed = errors.New("plugin manager is closed")

// ChecksumError means a plugin binary does not match its configured SHA256.
type ChecksumError struct {
	Path     string
	Expected string
	Actual   string
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("plugin binary %s has sha256 %s, but the configuration pins %s", e.Path, e.Actual, e.Expected)
}

// Spec says how to launch one provider's plugin process.
type Spec struct {
	Name    string   // provider name from config, for logs and errors
	Builtin string   // built-in type, launched by re-executing Options.Executable; or
	Path    string   // an external plugin binary
	Args    []string // arguments for Path
	SHA256  string   // optional pin for Path: refuse to start a binary that differs
}

// Options configures a Manager. Zero values select the defaults.
type Options struct {
	Executable      string        // binary to re-execute for built-ins; default os.Executable()
	Logger          *slog.Logger  // receives go-plugin's and the plugins' logs; default discards
	MaxMessageBytes int           // largest gRPC message either way; default 16 MiB
	StartTimeout    time.Duration // how long a plugin may take to handshake; default 10 s
}

// Manager owns the plugin processes: at most one per provider name, started
// on first use and relaunched after it exits.
type Manager struct {
	opts  Options
	unary bool // never use sessions; tests of the fallback set it

	mu       sync.Mutex
	closed   bool
	done     chan struct{} // closed by Close; ends relaunch backoffs
	handles  map[string]*handle
	launches sync.WaitGroup // launches in flight; Close waits for them
	kills    sync.WaitGroup // discarded processes being stopped; Close waits for them
	// sockets removes the plugin sockets of gateways that are gone.
	sockets socketSweeper
}

// NewManager returns a Manager; it starts no process until a provider is used.
func NewManager(opts Options) *Manager {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = wire.DefaultMaxMessageBytes
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 10 * time.Second
	}
	return &Manager{opts: opts, handles: make(map[string]*handle), done: make(chan struct{})}
}

// Provider returns the handle for spec.Name, creating it on the first request;
// later requests for the same name get the same handle and their spec is
// ignored. The process starts on the handle's first call.
func (m *Manager) Provider(spec Spec) providers.Provider {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, ok := m.handles[spec.Name]
	if !ok {
		h = &handle{m: m, spec: spec}
		m.handles[spec.Name] = h
	}
	return h
}

// Restarts reports how many times the named provider's process was launched
// again after an earlier one had been running.
func (m *Manager) Restarts(name string) int {
	m.mu.Lock()
	h, ok := m.handles[name]
	m.mu.Unlock()
	if !ok {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return max(h.launched-1, 0)
}

// Close kills every plugin process and waits for them to exit. Calls in
// flight fail; later calls fail with ErrClosed. Close is idempotent.
func (m *Manager) Close() error {
	m.mu.Lock()
	if !m.closed {
		m.closed = true
		close(m.done)
	}
	hs := make([]*handle, 0, len(m.handles))
	for _, h := range m.handles {
		hs = append(hs, h)
	}
	m.mu.Unlock()

	m.launches.Wait()
	var wg sync.WaitGroup
	for _, h := range hs {
		h.mu.Lock()
		inst := h.cur
		h.cur = nil
		h.mu.Unlock()
		if inst != nil {
			wg.Go(inst.kill)
		}
	}
	wg.Wait()
	m.kills.Wait()
	return nil
}

// retire kills a process given up on (it crashed, lost its connection or
// stopped reading) without making its caller wait.
func (m *Manager) retire(inst *instance) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		inst.stop(true)
		return
	}
	m.kills.Add(1)
	m.mu.Unlock()
	go func() {
		defer m.kills.Done()
		inst.stop(true)
	}()
}

// handle is the providers.Provider for one configured provider.
type handle struct {
	m    *Manager
	spec Spec

	mu       sync.Mutex
	cur      *instance // nil until started, after an exit, and after Close
	starting *launch   // the launch in flight, shared by every caller waiting
	launched int       // successful launches, for Restarts
	// failures counts the launches in a row that failed or whose process
	// was lost soon after; the next launch waits backoff(failures).
	failures    int
	lastFailure time.Time
}

// healthyAfter is how long a process must have served for its loss not
// to count towards the relaunch backoff.
const healthyAfter = 30 * time.Second

// backoff is how long to wait before launching after n failures in a row:
// nothing after the first, so a single crash costs one quick relaunch, then
// doubling, so a plugin that crashes on every call is not restarted in a
// tight loop.
func backoff(n int) time.Duration {
	if n < 2 {
		return 0
	}
	return min(50*time.Millisecond<<min(n-2, 10), 5*time.Second)
}

// instance is one running plugin process.
type instance struct {
	client  *plugin.Client
	cmd     *exec.Cmd
	rpc     providerv1.ProviderClient
	session *session        // nil when the plugin serves only unary Execute
	exited  <-chan struct{} // closed once the process has exited and been reaped
	// socketDir holds the plugin's socket; "" where plugins use TCP.
	socketDir string
	started   time.Time
	killOnce  sync.Once
	// stopping is set when the gateway stops a running process, so that
	// its exit is not taken for a crash.
	stopping atomic.Bool
}

// killGrace bounds go-plugin's graceful shutdown, which waits on an RPC
// that a plugin that stopped reading never answers.
const killGrace = 3 * time.Second

// kill stops the process, letting it shut down gracefully for a while, and
// releases go-plugin's goroutines; concurrent and later calls wait for the
// first.
func (i *instance) kill() { i.stop(false) }

// stop is kill; force skips the graceful part, for a process given up on.
func (i *instance) stop(force bool) {
	if !i.hasExited() {
		i.stopping.Store(true)
	}
	i.killOnce.Do(func() {
		if i.session != nil {
			i.session.close()
		}
		if force {
			_ = i.cmd.Process.Kill()
		}
		done := make(chan struct{})
		go func() {
			i.client.Kill()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(killGrace):
			_ = i.cmd.Process.Kill()
			<-done
		}
		removeSocketDir(i.socketDir)
	})
}

func removeSocketDir(dir string) {
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
}

func (i *instance) hasExited() bool {
	select {
	case <-i.exited:
		return true
	default:
		return false
	}
}

// usable reports whether the process can take calls: it is running and,
// if it has a session, the session still works.
func (i *instance) usable() bool {
	return !i.hasExited() && (i.session == nil || !i.session.isBroken())
}

type launch struct {
	done chan struct{}
	inst *instance
	err  error
}

func (h *handle) Describe(ctx context.Context) (providers.Info, error) {
	inst, err := h.instance(ctx)
	if err != nil {
		return providers.Info{}, err
	}
	resp, err := inst.rpc.Describe(ctx, &providerv1.DescribeRequest{})
	if err != nil {
		return providers.Info{}, h.callError(ctx, inst, "describing", err)
	}
	if e := resp.GetError(); e != nil {
		return providers.Info{}, wire.FromWireError(e)
	}
	return providers.Info{
		Name:         resp.Name,
		Version:      resp.Version,
		ActionTypes:  resp.ActionTypes,
		ConfigSchema: resp.ConfigSchema,
	}, nil
}

func (h *handle) Execute(ctx context.Context, req providers.Request) (providers.Response, error) {
	ctx, cancel := callContext(ctx, req)
	defer cancel()
	inst, err := h.instance(ctx)
	if err != nil {
		return providers.Response{}, err
	}
	var resp *providerv1.ExecuteResponse
	if inst.session != nil {
		resp, err = inst.session.execute(ctx, wireRequest(ctx, req))
	} else {
		resp, err = inst.rpc.Execute(ctx, wireRequest(ctx, req))
	}
	return h.result(ctx, inst, resp, err)
}

// Start makes the call as Execute does, and calls done with what Execute
// would return. Where the plugin is up and serves sessions, nothing waits
// for the answer: done is called on the goroutine that reads the plugin's
// answers, or on this one, and must not block. Otherwise the call runs on
// a goroutine of its own.
func (h *handle) Start(ctx context.Context, req providers.Request, done func(providers.Response, error)) {
	h.mu.Lock()
	inst := h.cur
	h.mu.Unlock()
	if inst == nil || inst.session == nil || !inst.usable() {
		go func() { done(h.Execute(ctx, req)) }()
		return
	}
	ctx, cancel := callContext(ctx, req)
	inst.session.start(ctx, wireRequest(ctx, req), func(resp *providerv1.ExecuteResponse, err error) {
		if err != nil {
			// Classifying a failure may replace the process, which waits.
			go func() {
				defer cancel()
				done(h.result(ctx, inst, nil, err))
			}()
			return
		}
		out, err := h.result(ctx, inst, resp, nil)
		cancel()
		done(out, err)
	})
}

// callContext is ctx ending at the request's deadline, if that is sooner.
func callContext(ctx context.Context, req providers.Request) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); !req.Deadline.IsZero() && (!ok || req.Deadline.Before(d)) {
		return context.WithDeadline(ctx, req.Deadline)
	}
	return ctx, func() {}
}

// wireRequest is req as it goes to the plugin, with ctx's deadline.
func wireRequest(ctx context.Context, req providers.Request) *providerv1.ExecuteRequest {
	in := &providerv1.ExecuteRequest{
		ActionType: req.ActionType,
		Payload:    req.Payload,
		Config:     req.Config,
		DedupKey:   req.DedupKey,
		Attempt:    int64(req.Attempt),
		RunId:      req.RunID,
		Step:       req.Step,
	}
	if deadline, ok := ctx.Deadline(); ok {
		in.Deadline = deadline.UnixNano()
	}
	return in
}

// result is what a call returns, given the plugin's answer or the call's
// failure.
func (h *handle) result(ctx context.Context, inst *instance, resp *providerv1.ExecuteResponse, err error) (providers.Response, error) {
	if err != nil {
		return providers.Response{}, h.callError(ctx, inst, "executing", err)
	}
	if e := resp.GetError(); e != nil {
		pe := wire.FromWireError(e)
		// When the plugin gave up because of the deadline, the caller should
		// still recognise its own context's end.
		pe.Err = ctxErr(ctx)
		return providers.Response{}, pe
	}
	return providers.Response{Body: resp.Body}, nil
}

// callError classifies a failed gRPC call: the caller gave up, the gateway is
// shutting down, the process died, the session broke, or the call itself was
// refused.
func (h *handle) callError(ctx context.Context, inst *instance, verb string, err error) error {
	name := h.spec.Name
	if err := ctxErr(ctx); err != nil {
		return fmt.Errorf("%s provider %q: %w", verb, name, err)
	}
	var pe *protocolError
	if errors.As(err, &pe) {
		return &providers.Error{Code: "plugin_protocol", Message: fmt.Sprintf("%s provider %q: %s", verb, name, pe.msg), Err: err}
	}
	var be *brokenSessionError
	if errors.As(err, &be) && status.Code(be.Err) != codes.Unavailable {
		// Whatever broke the stream, every call on it is lost and none can
		// be made on it again: the process is replaced and the call may be
		// retried on the next one.
		if h.m.isClosed() {
			return h.closedError()
		}
		h.discard(inst)
		return &providers.Error{Retryable: true, Code: "plugin_unavailable", Message: fmt.Sprintf("%s provider %q: %v", verb, name, be), Err: err}
	}
	switch status.Code(err) {
	case codes.Unavailable: // the connection broke; see below
	case codes.Canceled:
		return fmt.Errorf("%s provider %q: %w", verb, name, context.Canceled)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s provider %q: %w", verb, name, context.DeadlineExceeded)
	case codes.ResourceExhausted:
		return &providers.Error{Code: "message_too_large", Message: fmt.Sprintf("%s provider %q: %s (limit %d bytes)", verb, name, status.Convert(err).Message(), h.m.opts.MaxMessageBytes), Err: err}
	default:
		return fmt.Errorf("%s provider %q: %w", verb, name, err)
	}
	if h.m.isClosed() {
		return h.closedError()
	}
	// The connection broke. When the process died, go-plugin reaps it within
	// moments; a process that lives on with a broken connection is no use
	// either, so it is replaced all the same.
	select {
	case <-inst.exited:
	case <-time.After(2 * time.Second):
		h.discard(inst)
		return &providers.Error{Retryable: true, Code: "plugin_unavailable", Message: fmt.Sprintf("provider %q: lost the connection to the plugin process: %v", name, err), Err: err}
	}
	h.discard(inst)
	return &providers.Error{
		Retryable: true,
		Code:      "plugin_crashed",
		Message:   fmt.Sprintf("provider %q: plugin process exited during the call: %s", name, inst.cmd.ProcessState),
		Err:       err,
	}
}

// ctxErr is ctx.Err(), except that it is already DeadlineExceeded once the
// deadline has passed: the plugin's timer for the same deadline may fire, and
// its answer arrive, a moment before ctx's own timer.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

func (h *handle) closedError() error {
	return &providers.Error{Retryable: true, Code: "plugin_closed", Message: fmt.Sprintf("provider %q: %v", h.spec.Name, ErrClosed), Err: ErrClosed}
}

// discard forgets inst if it is still current, so the next call relaunches,
// and kills it in case it is still running.
func (h *handle) discard(inst *instance) {
	h.mu.Lock()
	if h.cur == inst {
		h.cur = nil
		h.noteFailure(inst)
	}
	h.mu.Unlock()
	h.m.retire(inst)
}

// noteFailure counts the loss of inst towards the relaunch backoff, unless
// it had served long enough to count as healthy. h.mu is held.
func (h *handle) noteFailure(inst *instance) {
	if inst != nil && time.Since(inst.started) > healthyAfter {
		h.failures = 0
	}
	h.failures++
	h.lastFailure = time.Now()
}

// instance returns the running process, launching one if there is none.
// Concurrent callers share one launch; each waits only as long as its ctx.
func (h *handle) instance(ctx context.Context) (*instance, error) {
	h.mu.Lock()
	if inst := h.cur; inst != nil {
		if inst.usable() {
			h.mu.Unlock()
			return inst, nil
		}
		if inst.hasExited() {
			h.m.opts.Logger.Info("relaunching the plugin after its process exited",
				"provider", h.spec.Name, "status", inst.cmd.ProcessState.String())
		} else {
			h.m.opts.Logger.Warn("plugin session broke; replacing the process",
				"provider", h.spec.Name, "err", inst.session.err)
		}
		h.cur = nil
		h.noteFailure(inst)
		h.m.retire(inst)
	}
	l := h.starting
	if l == nil {
		h.m.mu.Lock()
		if h.m.closed {
			h.m.mu.Unlock()
			h.mu.Unlock()
			return nil, h.closedError()
		}
		h.m.launches.Add(1)
		h.m.mu.Unlock()
		l = &launch{done: make(chan struct{})}
		h.starting = l
		go h.launch(l)
	}
	h.mu.Unlock()

	select {
	case <-l.done:
		return l.inst, l.err
	case <-ctx.Done():
		return nil, fmt.Errorf("starting plugin %q: %w", h.spec.Name, ctx.Err())
	}
}

// launch starts a process on behalf of every caller waiting on l. It is not
// bound to any one caller's ctx, since the others still want the process.
func (h *handle) launch(l *launch) {
	defer h.m.launches.Done()
	h.mu.Lock()
	wait := backoff(h.failures) - time.Since(h.lastFailure)
	h.mu.Unlock()
	var inst *instance
	var err error
	if wait > 0 {
		h.m.opts.Logger.Warn("plugin keeps failing; waiting before launching it again",
			"provider", h.spec.Name, "wait", wait.Round(time.Millisecond))
		select {
		case <-time.After(wait):
		case <-h.m.done:
			err = h.closedError()
		}
	}
	if err == nil {
		inst, err = h.start()
	}
	h.mu.Lock()
	h.starting = nil
	closed := err == nil && h.m.isClosed()
	switch {
	case err != nil:
		h.noteFailure(nil)
	case !closed:
		h.cur = inst
		h.launched++
	}
	h.mu.Unlock()
	if closed {
		inst.kill()
		inst, err = nil, h.closedError()
	}
	l.inst, l.err = inst, err
	close(l.done)
}

func (m *Manager) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

func (h *handle) start() (*instance, error) {
	inst, err := h.m.start(h.spec)
	if err != nil {
		return nil, &providers.Error{
			Retryable: transientStartError(err),
			Code:      "plugin_start",
			Message:   fmt.Sprintf("starting plugin %q: %v", h.spec.Name, err),
			Err:       err,
		}
	}
	h.m.opts.Logger.Info("plugin ready", "provider", h.spec.Name, "pid", inst.cmd.Process.Pid)
	go h.watch(inst)
	return inst, nil
}

// watch logs the process's exit if the gateway did not ask for it: a
// crash, a kill from outside (the OOM killer, an operator), or a plugin
// returning from main. Calls in flight fail as plugin_crashed and the next
// one relaunches it; the log line is what an operator alerts on.
func (h *handle) watch(inst *instance) {
	<-inst.exited
	if inst.stopping.Load() {
		return
	}
	h.m.opts.Logger.Error("plugin process crashed; the next call relaunches it",
		"provider", h.spec.Name, "pid", inst.cmd.Process.Pid, "status", inst.cmd.ProcessState.String())
}

// transientStartError reports whether a launch that failed with err may
// succeed if tried again: the plugin was too slow to start or to answer on
// a loaded machine. A missing binary, a checksum mismatch or a plugin that
// exits or speaks another protocol fails the same way every time.
func transientStartError(err error) bool {
	switch status.Code(err) {
	case codes.DeadlineExceeded, codes.Unavailable:
		return true
	}
	// go-plugin has no error value for it, only this text.
	return strings.Contains(err.Error(), "timeout while waiting for plugin to start") ||
		errors.Is(err, context.DeadlineExceeded)
}

func (m *Manager) command(spec Spec) (*exec.Cmd, error) {
	switch {
	case spec.Builtin != "" && spec.Path != "":
		return nil, errors.New("a provider is either built-in or a plugin binary, not both")
	case spec.Builtin != "":
		exe := m.opts.Executable
		if exe == "" {
			var err error
			if exe, err = os.Executable(); err != nil {
				return nil, fmt.Errorf("finding the gateway executable: %w", err)
			}
		}
		// The arguments only make the process recognisable in ps.
		cmd := exec.Command(exe, "plugin", spec.Builtin)
		cmd.Env = []string{BuiltinEnv + "=" + spec.Builtin}
		return cmd, nil
	case spec.Path != "":
		cmd := exec.Command(spec.Path, spec.Args...)
		if cmd.Err != nil {
			return nil, cmd.Err
		}
		if spec.SHA256 != "" {
			if err := verifySHA256(cmd.Path, spec.SHA256); err != nil {
				return nil, err
			}
		}
		return cmd, nil
	default:
		return nil, errors.New("neither a built-in type nor a plugin path is configured")
	}
}

func verifySHA256(path, want string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("checking plugin checksum: %w", err)
	}
	defer f.Close()
	sum := sha256.New()
	if _, err := io.Copy(sum, f); err != nil {
		return fmt.Errorf("checking plugin checksum of %s: %w", path, err)
	}
	want = strings.ToLower(strings.TrimPrefix(want, "sha256:"))
	if got := hex.EncodeToString(sum.Sum(nil)); got != want {
		return &ChecksumError{Path: path, Expected: want, Actual: got}
	}
	return nil
}

func (m *Manager) start(spec Spec) (*instance, error) {
	cmd, err := m.command(spec)
	if err != nil {
		return nil, err
	}
	cmd.Env = append(cmd.Env, wire.MaxMessageEnv+"="+strconv.Itoa(m.opts.MaxMessageBytes))
	m.sockets.sweep(m.opts.Logger)
	socketDir, err := wire.MakeSocketDir()
	if err != nil {
		return nil, err
	}
	// The gateway's own environment first, so that what is set here wins
	// over a variable of the same name there.
	cmd.Env = wire.SocketDirEnv(append(os.Environ(), cmd.Env...), socketDir)
	setDeathSignal(cmd)

	logger := m.opts.Logger.With("provider", spec.Name)
	stderr := &stderrHead{}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  wire.Handshake,
		VersionedPlugins: wire.PluginSets(nil, nil),
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		SkipHostEnv:      true, // in cmd.Env already
		AutoMTLS:         true,
		StartTimeout:     m.opts.StartTimeout,
		Logger:           newHCLogger(logger),
		Stderr:           stderr,
		SyncStdout:       &lineLogger{l: logger.With("stream", "stdout")},
		SyncStderr:       &lineLogger{l: logger.With("stream", "stderr")},
		GRPCDialOptions:  wire.DialOptions(m.opts.MaxMessageBytes),
	})
	fail := func(err error) (*instance, error) {
		client.Kill()
		removeSocketDir(socketDir)
		return nil, err
	}
	proto, err := startLocked(client)
	if err != nil {
		client.Kill()
		removeSocketDir(socketDir)
		// The process is gone: its stderr has been read to the end.
		if head := stderr.String(); head != "" {
			return nil, fmt.Errorf("plugin stderr: %s: %w", head, err)
		}
		return nil, err
	}
	raw, err := proto.Dispense(wire.PluginName)
	if err != nil {
		return fail(fmt.Errorf("dispensing the provider: %w", err))
	}
	d := raw.(*wire.Dispensed)
	inst := &instance{client: client, cmd: cmd, rpc: d.RPC, exited: d.Exited, socketDir: socketDir, started: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.StartTimeout)
	defer cancel()
	desc, err := d.RPC.Describe(ctx, &providerv1.DescribeRequest{})
	if err != nil {
		return fail(fmt.Errorf("describing the provider: %w", err))
	}
	if desc.Session && !m.unary {
		if inst.session, err = openSession(d.RPC, m.opts.MaxMessageBytes); err != nil {
			return fail(err)
		}
	}
	// However the process ends, its socket is of no more use.
	go func() {
		<-inst.exited
		removeSocketDir(socketDir)
	}()
	return inst, nil
}

// startLocked starts the process from a locked OS thread: the death signal
// set by setDeathSignal fires when the thread that forked the child exits,
// and Go ends a thread only when a goroutine exits while locked to it. A
// thread we lock and unlock ourselves lives as long as the gateway.
func startLocked(client *plugin.Client) (plugin.ClientProtocol, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return client.Client()
}

// stderrHead keeps the first lines a plugin writes to stderr, other than
// go-plugin's JSON log lines, so that a plugin that fails to start can say
// why (a usage message, a panic) in the error itself.
type stderrHead struct {
	mu      sync.Mutex
	partial []byte
	lines   []string
}

const headLines = 5

func (s *stderrHead) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.lines) >= headLines {
		return len(p), nil
	}
	s.partial = append(s.partial, p...)
	for len(s.lines) < headLines {
		i := bytes.IndexByte(s.partial, '\n')
		if i < 0 {
			break
		}
		line := strings.TrimSpace(string(s.partial[:i]))
		s.partial = s.partial[i+1:]
		if line != "" && !strings.HasPrefix(line, `{"@`) {
			s.lines = append(s.lines, line)
		}
	}
	if len(s.partial) > maxLogLine {
		s.partial = nil
	}
	return len(p), nil
}

func (s *stderrHead) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, " | ")
}
