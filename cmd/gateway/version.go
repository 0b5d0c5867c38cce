package main

import (
	"fmt"
	"io"
	"runtime/debug"

	"github.com/chaingate/gateway/cmd/gateway/internal/show"
)

const versionHelp = `Usage: gateway version [--output json]

Prints the gateway's module version, the commit it was built from (with
"+dirty" when the tree had changes) and its time, and the Go version.

`

// buildVersion is what the binary knows of its own build.
type buildVersion struct {
	Version   string `json:"version"`
	Commit    string `json:"commit,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	Time      string `json:"commit_time,omitempty"`
	GoVersion string `json:"go_version"`
}

func readBuildVersion() buildVersion {
	v := buildVersion{Version: "(devel)"}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.GoVersion = info.GoVersion
	if info.Main.Version != "" {
		v.Version = info.Main.Version
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		case "vcs.time":
			v.Time = s.Value
		}
	}
	return v
}

func (v buildVersion) String() string {
	s := "gateway " + v.Version
	if v.Commit == "" {
		s += ", commit unknown (built with -buildvcs=false or outside a git checkout)"
	} else {
		s += ", commit " + v.Commit
		if v.Modified {
			s += "+dirty"
		}
		if v.Time != "" {
			s += " (" + v.Time + ")"
		}
	}
	return s + ", " + v.GoVersion
}

func cmdVersion(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("version", stdout, stderr, versionHelp)
	output := fs.String("output", "text", "text or json")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return parseExit(err)
	}
	if len(pos) != 0 || (*output != "text" && *output != "json") {
		fs.Usage()
		return exitUsage
	}
	v := readBuildVersion()
	if *output == "json" {
		show.JSON(stdout, v)
		return exitOK
	}
	fmt.Fprintln(stdout, v)
	return exitOK
}
