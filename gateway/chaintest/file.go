package chaintest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/loader"
	"github.com/chaingate/gateway/chain/secrets"
	"github.com/chaingate/gateway/internal/jsonx"
)

// File is one test file: the config it tests and its cases.
type File struct {
	Path string
	// Config are the config files and directories the cases run against.
	Config []string
	// Secrets are the values <<secrets.NAME>> reads in every case.
	Secrets map[string]string
	// Real names the providers whose plugins run for real in every case.
	Real  []string
	Cases []*Case
}

// Case is one test case: what starts a run, what its steps answer, and what
// is expected of it.
type Case struct {
	Name string
	// Exactly one of Chain, Trigger and Schedule says what starts the run.
	Chain, Trigger, Schedule string
	Payload                  json.RawMessage
	// Request is the trigger's request body; Headers its headers.
	Request json.RawMessage
	Headers map[string]string
	Mocks   map[string]*Mock
	// Approvals answer approval steps by name; one not named waits until
	// its deadline.
	Approvals map[string]*Answer
	Real      []string
	Expect    Expect
	Src       chain.Source
}

// Mock is what a step's provider answers: Outcome on every attempt, or
// Attempts in turn (the last one repeating); for a step inside a split,
// Items may answer some items differently.
type Mock struct {
	Outcome
	Attempts []Outcome
	Items    []*ItemMock
	Src      chain.Source
}

// Outcome is one answer of a mocked call.
type Outcome struct {
	Body json.RawMessage
	// Error fails the call with this message; Retryable says whether the
	// step's retry policy may call again.
	Error     string
	Retryable bool
	// Delay is how long the call takes, on the test's clock: longer than
	// the step's timeout, it times out.
	Delay time.Duration
	set   bool
	// Code is the error's code, which a catch entry may name
	// ("code:DISK_FULL").
	Code string
}

// ItemMock answers the items of a split whose index is Index, or whose
// value holds Match (a subset).
type ItemMock struct {
	Index    *int
	Match    any
	Outcome  Outcome
	Attempts []Outcome
}

// Answer is a person's answer to an approval step: approve or reject, by
// whom, some time after it asked; Decision "timeout" leaves it unanswered.
type Answer struct {
	Decision, By, Comment string
	After                 time.Duration
}

// Expect is what a case checks, each with where it was written.
type Expect struct {
	Status      *Want[string]
	Path        *Want[[]string]
	Error       *Want[string]
	Steps       map[string]*StepExpect
	stepOrder   []string
	DeadLetters *Want[[]DeadLetterExpect]
	// Results are a trigger case's: what the door did with each alert.
	Results *Want[[]ResultExpect]
	// Failure is what the run's failure record says (failure.go).
	Failure *Want[FailureExpect]
}

// Want is one expectation and where it was written.
type Want[T any] struct {
	V   T
	Src chain.Source
}

// StepExpect is what a case expects of one step.
type StepExpect struct {
	Status   *Want[string]
	Attempts *Want[int]
	Body     *Want[any]
	Request  *Want[any]
	Error    *Want[string]
	Items    *Want[map[string]int]
	Child    *Want[string]
}

// DeadLetterExpect is a dead-letter entry a case expects.
type DeadLetterExpect struct {
	Step  string `json:"step"`
	Error string `json:"error,omitempty"`
}

// ResultExpect is what the door did with one alert or body.
type ResultExpect struct {
	Action  string `json:"action"`
	Chain   string `json:"chain,omitempty"`
	Payload any    `json:"payload,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// IsTestFile reports whether a file name is a test file's.
func IsTestFile(name string) bool { return strings.HasSuffix(name, "_test.toml") }

// Find returns the test files paths name: files as they are, and the
// *_test.toml files in directories, recursively, in order.
func Find(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("finding test files: %w", err)
		}
		if !fi.IsDir() {
			out = append(out, p)
			continue
		}
		err = filepath.WalkDir(p, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && IsTestFile(d.Name()) {
				out = append(out, path)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("finding test files: %w", err)
		}
	}
	return out, nil
}

// LoadFile reads and checks one test file. Every problem is reported with
// its file, line and key, as *chain.ConfigError.
func LoadFile(path string) (*File, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading test file: %w", err)
	}
	var root map[string]any
	if _, err := toml.Decode(string(src), &root); err != nil {
		d := chain.Diagnostic{File: path, Message: err.Error()}
		var pe toml.ParseError
		if errors.As(err, &pe) {
			d.Line, d.Col, d.Message = pe.Position.Line, pe.Position.Col, pe.Message
		}
		return nil, &chain.ConfigError{Diagnostics: []chain.Diagnostic{d}}
	}
	r := &reader{file: path, pos: loader.ScanPositions(string(src))}
	f := r.file_(root)
	if len(r.diags) > 0 {
		return nil, &chain.ConfigError{Diagnostics: r.diags}
	}
	return f, nil
}

// reader decodes a test file's tables strictly: an unknown key, a value of
// the wrong type or a missing one is a diagnostic at its line.
type reader struct {
	file  string
	pos   chain.Positions
	diags []chain.Diagnostic
}

// table is one TOML table being read: its keys are taken as they are read,
// and those left are unknown.
type table struct {
	r    *reader
	m    map[string]any
	path chain.KeyPath
	took map[string]bool
}

func (r *reader) table(m map[string]any, p chain.KeyPath) *table {
	return &table{r: r, m: m, path: p, took: map[string]bool{}}
}

func (r *reader) src(p chain.KeyPath) chain.Source { return chain.SourceAt(r.file, r.pos, p) }

func (r *reader) errorf(p chain.KeyPath, format string, args ...any) {
	r.diags = append(r.diags, r.src(p).Errorf(format, args...))
}

func (t *table) get(k string) (any, bool) {
	t.took[k] = true
	v, ok := t.m[k]
	return v, ok
}

func (t *table) str(k string) string {
	v, ok := t.get(k)
	if !ok {
		return ""
	}
	s, isStr := v.(string)
	if !isStr {
		t.r.errorf(t.path.Key(k), "must be a string, not %s", kind(v))
	}
	return s
}

func (t *table) strs(k string) []string {
	v, ok := t.get(k)
	if !ok {
		return nil
	}
	list, isList := v.([]any)
	var out []string
	for i, e := range list {
		s, isStr := e.(string)
		if !isStr {
			t.r.errorf(t.path.Key(k).Elem(i, ""), "must be a string, not %s", kind(e))
			continue
		}
		out = append(out, s)
	}
	if !isList {
		t.r.errorf(t.path.Key(k), "must be a list of strings, not %s", kind(v))
	}
	return out
}

func (t *table) boolean(k string) bool {
	v, ok := t.get(k)
	if !ok {
		return false
	}
	b, isBool := v.(bool)
	if !isBool {
		t.r.errorf(t.path.Key(k), "must be true or false, not %s", kind(v))
	}
	return b
}

func (t *table) integer(k string) (int, bool) {
	v, ok := t.get(k)
	if !ok {
		return 0, false
	}
	n, isInt := v.(int64)
	if !isInt {
		t.r.errorf(t.path.Key(k), "must be a whole number, not %s", kind(v))
	}
	return int(n), true
}

func (t *table) duration(k string) time.Duration {
	v, ok := t.get(k)
	if !ok {
		return 0
	}
	s, isStr := v.(string)
	if !isStr {
		t.r.errorf(t.path.Key(k), `must be a duration such as "30s" or "5m", not %s`, kind(v))
		return 0
	}
	d, err := chain.ParseDuration(s)
	if err != nil {
		t.r.errorf(t.path.Key(k), "%v", err)
	}
	return d
}

// json is a value of any type, as JSON.
func (t *table) json(k string) (json.RawMessage, bool) {
	v, ok := t.get(k)
	if !ok {
		return nil, false
	}
	b, err := jsonx.Marshal(plain(v))
	if err != nil {
		t.r.errorf(t.path.Key(k), "cannot be written as JSON: %v", err)
		return nil, false
	}
	return b, true
}

func (t *table) sub(k string) *table {
	v, ok := t.get(k)
	if !ok {
		return nil
	}
	m, isTable := v.(map[string]any)
	if !isTable {
		t.r.errorf(t.path.Key(k), "must be a table, not %s", kind(v))
		return nil
	}
	return t.r.table(m, t.path.Key(k))
}

// tables is an array of tables, or one table standing for a list of one.
func (t *table) tables(k string) []*table {
	v, ok := t.get(k)
	if !ok {
		return nil
	}
	var out []*table
	switch v := v.(type) {
	case []map[string]any:
		for i, m := range v {
			out = append(out, t.r.table(m, t.path.Key(k).Elem(i, "")))
		}
	case []any:
		for i, e := range v {
			m, isTable := e.(map[string]any)
			if !isTable {
				t.r.errorf(t.path.Key(k).Elem(i, ""), "must be a table, not %s", kind(e))
				continue
			}
			out = append(out, t.r.table(m, t.path.Key(k).Elem(i, "")))
		}
	default:
		t.r.errorf(t.path.Key(k), "must be a list of tables, not %s", kind(v))
	}
	return out
}

// done reports the keys nobody took, naming the nearest known one.
func (t *table) done(known ...string) {
	var left []string
	for k := range t.m {
		if !t.took[k] {
			left = append(left, k)
		}
	}
	sort.Strings(left)
	for _, k := range left {
		hint := ""
		if s := chain.Suggest(k, known); s != "" {
			hint = fmt.Sprintf(" (did you mean %q?)", s)
		}
		t.r.errorf(t.path.Key(k), "unknown key%s", hint)
	}
}

func (r *reader) file_(root map[string]any) *File {
	t := r.table(root, chain.KeyPath{})
	f := &File{Path: r.file}
	dir := filepath.Dir(r.file)
	for _, c := range t.strs("config") {
		f.Config = append(f.Config, filepath.Join(dir, c))
	}
	if f.Config == nil {
		// The config beside the test file: every other TOML file in its
		// directory.
		f.Config = []string{dir}
	}
	if s := t.sub("secrets"); s != nil {
		f.Secrets = map[string]string{}
		for k := range s.m {
			f.Secrets[k] = s.str(k)
		}
	}
	for _, name := range t.strs("env_secrets") {
		// As the gateway reads them: CHAINGATE_SECRET_NAME.
		v, ok := os.LookupEnv(secrets.EnvPrefix + name)
		if !ok {
			r.errorf(t.path.Key("env_secrets"), "the environment has no %s%s", secrets.EnvPrefix, name)
			continue
		}
		if f.Secrets == nil {
			f.Secrets = map[string]string{}
		}
		f.Secrets[name] = v
	}
	f.Real = t.strs("real_providers")
	cases := t.tables("tests")
	names := map[string]bool{}
	for i, ct := range cases {
		c := r.testCase(ct, i)
		if names[c.Name] {
			r.errorf(ct.path.Key("name"), "another case is named %q", c.Name)
		}
		names[c.Name] = true
		f.Cases = append(f.Cases, c)
	}
	if len(cases) == 0 && len(r.diags) == 0 {
		r.errorf(chain.KeyPath{}, "no [[tests]]: a test file holds at least one case")
	}
	t.done("config", "secrets", "env_secrets", "real_providers", "tests")
	return f
}

func (r *reader) testCase(t *table, i int) *Case {
	c := &Case{Src: r.src(t.path)}
	c.Name = t.str("name")
	if c.Name == "" {
		c.Name = fmt.Sprintf("case %d", i+1)
	}
	c.Chain, c.Trigger, c.Schedule = t.str("chain"), t.str("trigger"), t.str("schedule")
	starts := 0
	for _, s := range []string{c.Chain, c.Trigger, c.Schedule} {
		if s != "" {
			starts++
		}
	}
	if starts != 1 {
		r.errorf(t.path, "case %q: name exactly one of chain, trigger and schedule", c.Name)
	}
	c.Payload, _ = t.json("payload")
	if c.Trigger != "" {
		if c.Payload != nil {
			r.errorf(t.path.Key("payload"), "a trigger case's payload is what the trigger maps from its request: give request or request_file")
		}
		c.Request = r.request(t)
		if h := t.sub("headers"); h != nil {
			c.Headers = map[string]string{}
			for k := range h.m {
				c.Headers[k] = h.str(k)
			}
		}
	} else {
		for _, k := range []string{"request", "request_file", "headers"} {
			if _, ok := t.get(k); ok {
				r.errorf(t.path.Key(k), "only a trigger case takes %s", k)
			}
		}
	}
	c.Real = t.strs("real_providers")
	r.mocksAndAnswers(t, c)
	if e := t.sub("expect"); e != nil {
		c.Expect = r.expect(e)
	}
	t.done("name", "chain", "trigger", "schedule", "payload", "request", "request_file", "headers", "real_providers", "mocks", "approvals", "expect")
	return c
}

// mocksAndAnswers reads a case's mocks and approval answers.
func (r *reader) mocksAndAnswers(t *table, c *Case) {
	if m := t.sub("mocks"); m != nil {
		c.Mocks = map[string]*Mock{}
		for step := range m.m {
			if st := m.sub(step); st != nil {
				c.Mocks[step] = r.mock(st)
			}
		}
	}
	if a := t.sub("approvals"); a != nil {
		c.Approvals = map[string]*Answer{}
		for step := range a.m {
			if at := a.sub(step); at != nil {
				c.Approvals[step] = r.answer(at)
			}
		}
	}
}

// request is a trigger case's body, written inline or in a file beside
// the test file.
func (r *reader) request(t *table) json.RawMessage {
	body, inline := t.json("request")
	name := t.str("request_file")
	switch {
	case inline && name != "":
		r.errorf(t.path.Key("request_file"), "give request or request_file, not both")
	case name != "":
		b, err := os.ReadFile(filepath.Join(filepath.Dir(r.file), name))
		if err != nil {
			r.errorf(t.path.Key("request_file"), "%v", err)
			return nil
		}
		if !json.Valid(b) {
			r.errorf(t.path.Key("request_file"), "%s is not JSON", name)
			return nil
		}
		return b
	case !inline:
		r.errorf(t.path, "a trigger case needs request (a table) or request_file (a JSON file beside the test file)")
	}
	return body
}

var outcomeKeys = []string{"body", "error", "retryable", "delay", "code"}

func (r *reader) outcome(t *table) Outcome {
	o := Outcome{}
	o.Body, o.set = t.json("body")
	if e, ok := t.get("error"); ok {
		o.set = true
		s, isStr := e.(string)
		if !isStr || s == "" {
			r.errorf(t.path.Key("error"), "must be the error's message")
		}
		o.Error = s
	}
	o.Retryable = t.boolean("retryable")
	if o.Retryable && o.Error == "" {
		r.errorf(t.path.Key("retryable"), "only an error is retryable")
	}
	if o.Code = t.str("code"); o.Code != "" && o.Error == "" {
		r.errorf(t.path.Key("code"), "only an error has a code")
	}
	o.Delay = t.duration("delay")
	if o.Body != nil && o.Error != "" {
		r.errorf(t.path.Key("error"), "an answer has a body or an error, not both")
	}
	return o
}

func (r *reader) attempts(t *table) []Outcome {
	var out []Outcome
	for _, at := range t.tables("attempts") {
		out = append(out, r.outcome(at))
		at.done(outcomeKeys...)
	}
	return out
}

func (r *reader) mock(t *table) *Mock {
	m := &Mock{Src: r.src(t.path)}
	m.Outcome = r.outcome(t)
	m.Attempts = r.attempts(t)
	if m.Outcome.set && m.Attempts != nil {
		r.errorf(t.path.Key("attempts"), "give one answer (body, error) or attempts, not both")
	}
	for _, it := range t.tables("items") {
		im := &ItemMock{}
		if n, ok := it.integer("index"); ok {
			im.Index = &n
		}
		if v, ok := it.get("match"); ok {
			im.Match = plain(v)
		}
		if (im.Index == nil) == (im.Match == nil) {
			r.errorf(it.path, "an item's answer names index or match")
		}
		im.Outcome = r.outcome(it)
		im.Attempts = r.attempts(it)
		it.done(append([]string{"index", "match", "attempts"}, outcomeKeys...)...)
		m.Items = append(m.Items, im)
	}
	t.done(append([]string{"attempts", "items"}, outcomeKeys...)...)
	return m
}

func (r *reader) answer(t *table) *Answer {
	a := &Answer{Decision: t.str("decision"), By: t.str("by"), Comment: t.str("comment"), After: t.duration("after")}
	switch a.Decision {
	case chain.DecisionApprove, chain.DecisionReject, "timeout":
	default:
		r.errorf(t.path.Key("decision"), `must be "approve", "reject" or "timeout", not %q`, a.Decision)
	}
	if a.By == "" {
		a.By = "test"
	}
	t.done("decision", "by", "comment", "after")
	return a
}

func want[T any](r *reader, t *table, k string, v T) *Want[T] {
	return &Want[T]{V: v, Src: r.src(t.path.Key(k))}
}

func (r *reader) expect(t *table) Expect {
	var e Expect
	if _, ok := t.m["status"]; ok {
		e.Status = want(r, t, "status", t.str("status"))
	}
	if _, ok := t.m["path"]; ok {
		e.Path = want(r, t, "path", t.strs("path"))
	}
	if _, ok := t.m["error"]; ok {
		e.Error = want(r, t, "error", t.str("error"))
	}
	if s := t.sub("steps"); s != nil {
		e.Steps = map[string]*StepExpect{}
		for name := range s.m {
			e.stepOrder = append(e.stepOrder, name)
			if st := s.sub(name); st != nil {
				e.Steps[name] = r.stepExpect(st)
			}
		}
		sort.Slice(e.stepOrder, func(i, j int) bool {
			return r.src(s.path.Key(e.stepOrder[i])).Line < r.src(s.path.Key(e.stepOrder[j])).Line
		})
	}
	if _, ok := t.m["dead_letters"]; ok {
		var list []DeadLetterExpect
		for _, dt := range t.tables("dead_letters") {
			list = append(list, DeadLetterExpect{Step: dt.str("step"), Error: dt.str("error")})
			dt.done("step", "error")
		}
		e.DeadLetters = &Want[[]DeadLetterExpect]{V: list, Src: r.src(t.path.Key("dead_letters"))}
	}
	if _, ok := t.m["results"]; ok {
		var list []ResultExpect
		for _, rt := range t.tables("results") {
			re := ResultExpect{Action: rt.str("action"), Chain: rt.str("chain"), Reason: rt.str("reason")}
			if v, ok := rt.get("payload"); ok {
				re.Payload = plain(v)
			}
			list = append(list, re)
			rt.done("action", "chain", "payload", "reason")
		}
		e.Results = &Want[[]ResultExpect]{V: list, Src: r.src(t.path.Key("results"))}
	}
	e.Failure = r.failureExpect(t)
	t.done("status", "path", "error", "steps", "dead_letters", "results", "failure")
	return e
}

func (r *reader) stepExpect(t *table) *StepExpect {
	se := &StepExpect{}
	if _, ok := t.m["status"]; ok {
		se.Status = want(r, t, "status", t.str("status"))
	}
	if _, ok := t.m["attempts"]; ok {
		n, _ := t.integer("attempts")
		se.Attempts = want(r, t, "attempts", n)
	}
	if v, ok := t.get("body"); ok {
		se.Body = want(r, t, "body", plain(v))
	}
	if v, ok := t.get("request"); ok {
		se.Request = want(r, t, "request", plain(v))
	}
	if _, ok := t.m["error"]; ok {
		se.Error = want(r, t, "error", t.str("error"))
	}
	if it := t.sub("items"); it != nil {
		counts := map[string]int{}
		for _, k := range []string{"succeeded", "failed", "skipped", "total"} {
			if n, ok := it.integer(k); ok {
				counts[k] = n
			}
		}
		it.done("succeeded", "failed", "skipped", "total")
		se.Items = want(r, t, "items", counts)
	}
	if _, ok := t.m["child"]; ok {
		se.Child = want(r, t, "child", t.str("child"))
	}
	t.done("status", "attempts", "body", "request", "error", "items", "child")
	return se
}

// plain turns decoded TOML into the values JSON decoding gives, so that
// expectations compare with what runs recorded.
func plain(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = plain(e)
		}
		return out
	case []map[string]any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = plain(e)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = plain(e)
		}
		return out
	case int64:
		return float64(v)
	case time.Time:
		return v.Format(time.RFC3339Nano)
	}
	return v
}

func kind(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case int64, float64:
		return "a number"
	case bool:
		return "a boolean"
	case map[string]any:
		return "a table"
	case []any, []map[string]any:
		return "a list"
	}
	return fmt.Sprintf("%T", v)
}

// sortedKeys lists a map's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
