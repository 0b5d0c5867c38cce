package show

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/gateway/chaintest"
	"github.com/chaingate/gateway/internal/textx"
)

// LoadError prints why test files or their config did not load, a line per
// problem.
func LoadError(w io.Writer, err error) {
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

// TestText prints the cases that failed (each with -v), coverage if asked,
// and a summary line.
func TestText(w io.Writer, results []*chaintest.Result, cov *chaintest.Coverage, took time.Duration, verbose bool) {
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

// JUnit writes the results as JUnit XML.
func JUnit(w io.Writer, results []*chaintest.Result, took time.Duration) {
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

// TestJSON writes the results, and coverage if asked, as one JSON object.
func TestJSON(w io.Writer, results []*chaintest.Result, cov *chaintest.Coverage, took time.Duration) {
	JSON(w, testReport(results, cov, took))
}
