package main

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/cmd/gateway/internal/show"
	"github.com/chaingate/gateway/gateway"
)

// serviceFlags are the flags the long-running commands, serve and worker,
// share, and their start-up: arguments checked, CPU profile started, JSON
// logger made, config loaded.
type serviceFlags struct {
	name       string
	fs         *flagSet
	configs    stringList
	logLevel   *string
	cpuProfile *string
}

func newServiceFlags(name string, fs *flagSet) *serviceFlags {
	sf := &serviceFlags{name: name, fs: fs}
	fs.Var(&sf.configs, "config", "config file or directory (repeatable)")
	sf.logLevel = fs.String("log-level", "info", logLevelUsage)
	sf.cpuProfile = fs.String("cpuprofile", "", "write a CPU profile of the process to this file until it stops (for go tool pprof)")
	return sf
}

// start parses args and starts the service's process-wide parts. Unless
// ok, the command ends at once with code (exitOK after -h); if ok, stop
// must be called when the command ends.
func (sf *serviceFlags) start(args []string, stderr io.Writer) (logger *slog.Logger, cfg *chain.Config, stop func(), code int, ok bool) {
	pos, err := parseInterleaved(sf.fs, args)
	if err != nil {
		return nil, nil, nil, parseExit(err), false
	}
	if len(pos) != 0 || len(sf.configs) == 0 {
		fmt.Fprintf(stderr, "gateway %s: takes no arguments and needs at least one --config\n", sf.name)
		sf.fs.Usage()
		return nil, nil, nil, exitUsage, false
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*sf.logLevel)); err != nil {
		fmt.Fprintf(stderr, "gateway %s: bad --log-level %q\n", sf.name, *sf.logLevel)
		return nil, nil, nil, exitUsage, false
	}
	stopProfile, err := startCPUProfile(*sf.cpuProfile)
	if err != nil {
		fmt.Fprintf(stderr, "gateway %s: %v\n", sf.name, err)
		return nil, nil, nil, exitUsage, false
	}
	logger = slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	if cfg, err = gateway.LoadConfig(sf.configs); err != nil {
		show.ConfigError(stderr, err)
		stopProfile()
		return nil, nil, nil, exitUsage, false
	}
	for _, w := range cfg.Warnings {
		logger.Warn("config", "warning", w.String())
	}
	return logger, cfg, stopProfile, exitOK, true
}
