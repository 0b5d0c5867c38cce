package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/chain/store/backup"
	"github.com/chaingate/gateway/cmd/gateway/internal/show"
	"github.com/chaingate/gateway/gateway"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/gateway/upkeep"
	"github.com/chaingate/gateway/internal/textx"
)

const backupHelp = `Usage: gateway backup OUT --server URL [--token T]
       gateway backup OUT --state URL        (or --config PATH... for [gateway].state)

Writes a backup of a store to the file OUT ("-" for stdout). OUT is
written beside itself under another name, checked whole, and only then
renamed into place (replacing an older OUT): it is never a backup cut
short.

--server takes the backup from a serving gateway, which streams it from
the store it holds; it needs a full token (a backup holds every payload
and result). --state takes it from a store directly: an embedded store
file no gateway runs on (one a gateway holds is refused: use --server),
or a Redis store. Without either, $CHAINGATE_SERVER if set, else the
config's [gateway].state, else ` + gateway.DefaultState + `.

Every run in a backup is as one moment saw it: gateway restore brings it
back into an empty store, and gateway resume (or serve) then carries the
unfinished runs on as after a crash. Exit status: 0 written, 1 failed,
2 usage.

`

const restoreHelp = `Usage: gateway restore IN --state URL    (or --config PATH... for [gateway].state)

Brings the backup IN ("-" for stdin) back into a store that holds
nothing: an embedded store file that does not exist yet, or holds no
record, or a Redis prefix that holds no key. No gateway may use the store
meanwhile. The backup is read whole and checked before anything takes the
store's place: one cut short, damaged, or written by a later version is
refused, and nothing is left behind.

Afterwards gateway resume (or serve) carries the unfinished runs on as
after a crash: no step with a recorded result is called again, steps that
were in flight are dispatched again with the same dedup key. Exit status:
0 restored, 1 refused or failed, 2 usage.

`

const compactHelp = `Usage: gateway compact --state FILE     (or --config PATH... for [gateway].state)

Rewrites an embedded store file without its free pages: the file keeps
the space of what was deleted (runs, dead-letter entries) for later
writes, and never gives it back on its own. The gateway must be stopped:
compact takes the file's lock and refuses a file a gateway holds. The
copy is written beside the file, synced and checked, then renamed over
it; interrupted, it leaves the file as it was. Exit status: 0 compacted,
1 refused or failed, 2 usage.

`

// stateOf is the store a command names with --state or --config.
func stateOf(state string, configs []string) (string, error) {
	var cfg *chain.Config
	if len(configs) > 0 && state == "" {
		var err error
		if cfg, err = gateway.LoadConfig(configs); err != nil {
			return "", err
		}
	}
	return gateway.StateURL(cfg, state)
}

func cmdBackup(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("backup", stdout, stderr, backupHelp)
	server := fs.String("server", "", "gateway API to take the backup through, e.g. http://127.0.0.1:8080 (default $CHAINGATE_SERVER unless --state is given)")
	token := fs.String("token", os.Getenv("CHAINGATE_TOKEN"), "API bearer token, a full one (default $CHAINGATE_TOKEN)")
	state := stateFlag(fs.FlagSet)
	var configs stringList
	fs.Var(&configs, "config", "config file or directory, read for [gateway].state and the secrets its URL reads (repeatable)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return parseExit(err)
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "gateway backup: need exactly one OUT")
		fs.Usage()
		return exitUsage
	}
	if *server != "" && (*state != "" || len(configs) > 0) {
		fmt.Fprintln(stderr, "gateway backup: give --server or --state (or --config), not both")
		return exitUsage
	}
	if *server == "" && *state == "" && len(configs) == 0 {
		*server = os.Getenv("CHAINGATE_SERVER")
	}
	from := "of the gateway at " + *server
	var take func(w io.Writer) (store.SnapshotInfo, error)
	if *server != "" {
		client := api.NewClient(*server, *token)
		take = func(w io.Writer) (store.SnapshotInfo, error) {
			_, err := client.Backup(ctx, w)
			return store.SnapshotInfo{}, err
		}
	} else {
		url, err := stateOf(*state, configs)
		if err != nil {
			show.ConfigError(stderr, err)
			return exitUsage
		}
		from = upkeep.StateName(url)
		logger, _ := newLogger(stderr, "warn")
		take = func(w io.Writer) (store.SnapshotInfo, error) {
			info, err := upkeep.BackupState(ctx, url, w, logger)
			if errors.Is(err, store.ErrInUse) {
				err = fmt.Errorf("%w; a gateway is running on it: take the backup through it with --server URL", err)
			}
			return info, err
		}
	}
	start := time.Now()
	out := pos[0]
	info, size, err := upkeep.WriteBackup(out, stdout, take)
	if err != nil {
		return fail(stderr, "backup", err)
	}
	report := stdout
	if out == "-" {
		report = stderr
	}
	fmt.Fprintf(report, "backed up %s from the %s store %s to %s (%s, %s)\n", textx.Count(info.Runs, "run", "runs"), info.Kind, from, out, show.ByteSize(size), time.Since(start).Round(time.Millisecond))
	return exitOK
}

func cmdRestore(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("restore", stdout, stderr, restoreHelp)
	state := fs.String("state", "", "store to restore into: a bolt file path or bolt://PATH, or redis://[:PASSWORD@]HOST:PORT/DB?prefix=P (rediss:// for TLS)")
	var configs stringList
	fs.Var(&configs, "config", "config file or directory, read for [gateway].state and the secrets its URL reads (repeatable)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return parseExit(err)
	}
	if len(pos) != 1 || (*state == "" && len(configs) == 0) {
		fmt.Fprintln(stderr, "gateway restore: need exactly one IN, and the store to restore into: --state URL, or --config for [gateway].state")
		fs.Usage()
		return exitUsage
	}
	url, err := stateOf(*state, configs)
	if err != nil {
		show.ConfigError(stderr, err)
		return exitUsage
	}
	in := io.Reader(os.Stdin)
	if pos[0] != "-" {
		f, err := os.Open(pos[0])
		if err != nil {
			return fail(stderr, "restore", err)
		}
		defer f.Close()
		in = f
	}
	start := time.Now()
	r, err := backup.NewReader(in)
	if err != nil {
		return fail(stderr, "restore", err)
	}
	logger, _ := newLogger(stderr, "warn")
	info, err := upkeep.RestoreState(ctx, r, url, logger)
	if err != nil {
		return fail(stderr, "restore", err)
	}
	fmt.Fprintf(stdout, "restored %s (%d unfinished) into %s (%s)\n", textx.Count(info.Runs, "run", "runs"), info.Unfinished, upkeep.StateName(url), time.Since(start).Round(time.Millisecond))
	if info.Unfinished > 0 {
		fmt.Fprintln(stdout, "gateway resume, or gateway serve, carries the unfinished runs on")
	}
	return exitOK
}

func cmdCompact(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("compact", stdout, stderr, compactHelp)
	state := fs.String("state", "", "the embedded store file: a path or bolt://PATH")
	var configs stringList
	fs.Var(&configs, "config", "config file or directory, read for [gateway].state (repeatable)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return parseExit(err)
	}
	if len(pos) != 0 || (*state == "" && len(configs) == 0) {
		fmt.Fprintln(stderr, "gateway compact: takes no arguments, and the store file: --state FILE, or --config for [gateway].state")
		fs.Usage()
		return exitUsage
	}
	url, err := stateOf(*state, configs)
	if err != nil {
		show.ConfigError(stderr, err)
		return exitUsage
	}
	start := time.Now()
	info, err := upkeep.CompactState(ctx, url)
	if err != nil {
		return fail(stderr, "compact", err)
	}
	fmt.Fprintf(stdout, "compacted %s from %s to %s (%s)\n", upkeep.StateName(url), show.ByteSize(info.Before), show.ByteSize(info.After), time.Since(start).Round(time.Millisecond))
	return exitOK
}
