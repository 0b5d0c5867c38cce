package main

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/chaintest"
	"github.com/chaingate/gateway/internal/textx"
)

const testHelp = `Usage: gateway test PATH... [--run REGEX] [--output text|json|junit] [--coverage] [--parallel N] [-v]

Runs the test cases of *_test.toml files (PATH names files, or directories
searched for them) against the config beside them, in this process: every
provider call is answered by the case's mocks, approvals by its answers, and
time is virtual, so retries, backoff and timeouts take none. Nothing is
stored, sent or paged. docs/testing.md describes the file.

Exit status: 0 when every case passes, 1 when one fails, 2 when a test file
or the config it tests cannot be loaded.

Flags:
`

func cmdTest(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("test", stdout, stderr, testHelp)
	runRe := fs.String("run", "", "run only the cases whose name, or FILE/NAME, matches this regular expression")
	output := fs.String("output", "text", "text, json (one object with every case) or junit (JUnit XML, for CI systems)")
	coverage := fs.Bool("coverage", false, "report, per chain, the steps no case ran, the branches none took, and the conditions never true or never false")
	parallel := fs.Int("parallel", 0, "cases run at once (default: the number of CPUs)")
	verbose := fs.Bool("v", false, "list every case, not only those that fail")
	paths, err := parseInterleaved(fs, args)
	if err != nil {
		return parseExit(err)
	}
	if len(paths) == 0 || (*output != "text" && *output != "json" && *output != "junit") {
		fs.Usage()
		return exitUsage
	}
	opts := chaintest.Options{Parallel: *parallel}
	if *runRe != "" {
		if opts.Run, err = regexp.Compile(*runRe); err != nil {
			fmt.Fprintf(stderr, "gateway test: --run: %v\n", err)
			return exitUsage
		}
	}
	if exe, err := os.Executable(); err == nil {
		opts.Executable = exe
	}
	suite, err := chaintest.Load(paths)
	if err != nil {
		printLoadError(stderr, err)
		return exitUsage
	}
	began := time.Now()
	results := suite.Run(ctx, opts)
	took := time.Since(began)
	var cov *chaintest.Coverage
	if *coverage {
		cov = chaintest.Cover(suite, results)
	}
	failed := 0
	for _, r := range results {
		if r.Failed() {
			failed++
		}
	}
	switch *output {
	case "json":
		printJSON(stdout, testReport(results, cov, took))
	case "junit":
		writeJUnit(stdout, results, took)
	default:
		printTestText(stdout, results, cov, took, *verbose)
	}
	if failed > 0 {
		return exitFailed
	}
	return exitOK
}

func printLoadError(w io.Writer, err error) {
	var ce *chain.ConfigError
	for _, e := range unjoin(err) {
		if errors.As(e, &ce) {
			for _, d := range ce.Diagnostics {
				fmt.Fprintln(w, d.String())
			}
			continue
		}
		fmt.Fprintln(w, e)
	}
}

// unjoin lists the errors errors.Join joined, or err alone.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unjoin(e)...)
		}
		return out
	}
	return []error{err}
}

func where(src chain.Source) string {
	if src.Line > 0 {
		return fmt.Sprintf("%s:%d", src.File, src.Line)
	}
	return src.File
}

func printTestText(w io.Writer, results []*chaintest.Result, cov *chaintest.Coverage, took time.Duration, verbose bool) {
	failed := 0
	for _, r := range results {
		if !r.Failed() {
			if verbose {
				fmt.Fprintf(w, "ok    %s  %s (%s on the clock)\n", where(r.Src), r.Case, r.Ended.Round(time.Millisecond))
			}
			continue
		}
		failed++
		fmt.Fprintf(w, "FAIL  %s  %s\n", where(r.Src), r.Case)
		for _, f := range r.Failures {
			fmt.Fprintf(w, "    %s: %s\n", where(f.Src), f.Message)
		}
	}
	if cov != nil {
		cov.Print(w)
	}
	if failed > 0 {
		fmt.Fprintf(w, "FAIL  %d of %s failed (%s)\n", failed, textx.Count(len(results), "case", "cases"), took.Round(time.Millisecond))
		return
	}
	fmt.Fprintf(w, "ok    %s passed (%s)\n", textx.Count(len(results), "case", "cases"), took.Round(time.Millisecond))
}

type testCaseJSON struct {
	File     string            `json:"file"`
	Line     int               `json:"line"`
	Case     string            `json:"case"`
	Passed   bool              `json:"passed"`
	Failures []testFailureJSON `json:"failures"`
	// Clock is how long the case's runs took on its virtual clock.
	Clock string `json:"clock"`
}

type testFailureJSON struct {
	File    string `json:"file"`
	Line    int    `json:"line"`
	Message string `json:"message"`
}

type testReportJSON struct {
	Passed   bool                `json:"passed"`
	Cases    []testCaseJSON      `json:"cases"`
	Took     string              `json:"took"`
	Coverage *chaintest.Coverage `json:"coverage,omitempty"`
}

func testReport(results []*chaintest.Result, cov *chaintest.Coverage, took time.Duration) testReportJSON {
	rep := testReportJSON{Passed: true, Cases: []testCaseJSON{}, Took: took.String(), Coverage: cov}
	for _, r := range results {
		c := testCaseJSON{File: r.Src.File, Line: r.Src.Line, Case: r.Case, Passed: !r.Failed(), Failures: []testFailureJSON{}, Clock: r.Ended.String()}
		for _, f := range r.Failures {
			c.Failures = append(c.Failures, testFailureJSON{File: f.Src.File, Line: f.Src.Line, Message: f.Message})
		}
		rep.Passed = rep.Passed && c.Passed
		rep.Cases = append(rep.Cases, c)
	}
	return rep
}

// JUnit XML, as CI systems read it: a suite per test file, a testcase per
// case, a failure element per expectation not met.
type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Time     string       `xml:"time,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string         `xml:"name,attr"`
	Classname string         `xml:"classname,attr"`
	File      string         `xml:"file,attr"`
	Line      int            `xml:"line,attr"`
	Time      string         `xml:"time,attr"`
	Failures  []junitFailure `xml:"failure"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

func writeJUnit(w io.Writer, results []*chaintest.Result, took time.Duration) {
	out := junitSuites{Time: seconds(took)}
	index := map[string]int{}
	for _, r := range results {
		i, ok := index[r.File]
		if !ok {
			i = len(out.Suites)
			index[r.File] = i
			out.Suites = append(out.Suites, junitSuite{Name: r.File})
		}
		s := &out.Suites[i]
		c := junitCase{Name: r.Case, Classname: r.File, File: r.Src.File, Line: r.Src.Line, Time: seconds(r.Took)}
		for _, f := range r.Failures {
			c.Failures = append(c.Failures, junitFailure{Message: f.Message, Type: "expectation", Text: where(f.Src) + ": " + f.Message})
		}
		s.Tests++
		out.Tests++
		if len(c.Failures) > 0 {
			s.Failures++
			out.Failures++
		}
		s.Cases = append(s.Cases, c)
	}
	for i := range out.Suites {
		var t time.Duration
		for _, r := range results {
			if r.File == out.Suites[i].Name {
				t += r.Took
			}
		}
		out.Suites[i].Time = seconds(t)
	}
	fmt.Fprint(w, xml.Header)
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	_ = enc.Encode(out)
	fmt.Fprintln(w)
}

// dryRunChain runs a chain with every call mocked and prints, step by
// step, what would have been called with what.
func dryRunChain(ctx context.Context, configs []string, chainName string, payload []byte, mocks string, stdout, stderr io.Writer) int {
	cfg, err := gateway.LoadConfig(configs)
	if err != nil {
		printLoadError(stderr, err)
		return exitUsage
	}
	if cfg.Chains[chainName] == nil {
		fmt.Fprintf(stderr, "gateway run: unknown chain %q; the config defines %s\n", chainName, strings.Join(cfg.ChainNames, ", "))
		return exitUsage
	}
	res, err := chaintest.DryRun(ctx, cfg, chainName, payload, mocks)
	if err != nil {
		printLoadError(stderr, err)
		return exitUsage
	}
	fmt.Fprintf(stdout, "dry run of %s: nothing was called; each call below was answered by a mock\n\n", chainName)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tPROVIDER\tACTION\tATTEMPT\tREQUEST")
	for _, c := range res.Calls {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", c.Step, c.Provider, c.Action, c.Attempt, c.Request)
	}
	_ = tw.Flush()
	for _, f := range res.Failures {
		fmt.Fprintf(stdout, "\n%s\n", f.Message)
	}
	if len(res.Runs) == 0 {
		return exitFailed
	}
	run := res.Runs[0].Run
	fmt.Fprintf(stdout, "\nrun %s: path %s (%s on the clock)\n", run.Status, strings.Join(run.Path, " → "), res.Ended.Round(time.Millisecond))
	if run.Error != nil {
		fmt.Fprintf(stdout, "error: %s\n", run.Error.Message)
	}
	if run.Status != store.RunSucceeded {
		if mocks == "" {
			fmt.Fprintln(stdout, "(every call was answered with {}: give the answers later steps read with --mocks FILE)")
		}
		return exitFailed
	}
	return exitOK
}
