package chaintest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/BurntSushi/toml"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/loader"
)

// DryRun runs a chain of cfg as a case in which nothing is called: the
// mocks file, when given ([mocks.STEP] and [approvals.STEP] tables, as a
// case writes them), answers the steps it names, and every other call
// succeeds with {}. The result's Calls are what each step would have
// been called with.
func DryRun(ctx context.Context, cfg *chain.Config, chainName string, payload json.RawMessage, mocksPath string) (*Result, error) {
	c := &Case{Name: "dry run", Chain: chainName, Payload: payload, Src: chain.Source{File: "dry run"}}
	if mocksPath != "" {
		if err := loadMocks(mocksPath, c); err != nil {
			return nil, err
		}
	}
	f := &File{Path: "dry run", Config: []string{"dry run"}, Cases: []*Case{c}}
	s := &Suite{Files: []*File{f}, configs: map[string]*chain.Config{}}
	s.configs[configKey(f)] = cfg
	if err := s.check(f); err != nil {
		return nil, err
	}
	return s.RunCase(ctx, f, c, Options{DryRun: true}), nil
}

// loadMocks reads a dry run's mocks file into c.
func loadMocks(path string, c *Case) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading mocks file: %w", err)
	}
	var root map[string]any
	if _, err := toml.Decode(string(src), &root); err != nil {
		d := chain.Diagnostic{File: path, Message: err.Error()}
		var pe toml.ParseError
		if errors.As(err, &pe) {
			d.Line, d.Col, d.Message = pe.Position.Line, pe.Position.Col, pe.Message
		}
		return &chain.ConfigError{Diagnostics: []chain.Diagnostic{d}}
	}
	r := &reader{file: path, pos: loader.ScanPositions(string(src))}
	t := r.table(root, chain.KeyPath{})
	r.mocksAndAnswers(t, c)
	t.done("mocks", "approvals")
	if len(r.diags) > 0 {
		return &chain.ConfigError{Diagnostics: r.diags}
	}
	return nil
}
