package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/chaingate/gateway/cmd/gateway/internal/show"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/chaintest"
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
		show.LoadError(stderr, err)
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
		show.TestJSON(stdout, results, cov, took)
	case "junit":
		show.JUnit(stdout, results, took)
	default:
		show.TestText(stdout, results, cov, took, *verbose)
	}
	if failed > 0 {
		return exitFailed
	}
	return exitOK
}

// dryRunChain runs a chain with every call mocked and prints, step by
// step, what would have been called with what.
func dryRunChain(ctx context.Context, configs []string, chainName string, payload []byte, mocks string, stdout, stderr io.Writer) int {
	cfg, err := gateway.LoadConfig(configs)
	if err != nil {
		show.LoadError(stderr, err)
		return exitUsage
	}
	if cfg.Chains[chainName] == nil {
		fmt.Fprintf(stderr, "gateway run: unknown chain %q; the config defines %s\n", chainName, strings.Join(cfg.ChainNames, ", "))
		return exitUsage
	}
	res, err := chaintest.DryRun(ctx, cfg, chainName, payload, mocks)
	if err != nil {
		show.LoadError(stderr, err)
		return exitUsage
	}
	if !show.DryRun(stdout, chainName, res, mocks != "") {
		return exitFailed
	}
	return exitOK
}
