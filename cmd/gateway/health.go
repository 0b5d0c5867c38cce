package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

const healthHelp = `Usage: gateway health [--server URL] [--path /readyz] [--timeout 5s]

Asks a gateway (or a worker started with --listen) whether it is ready, and
exits 0 when it answers 200, 1 otherwise, printing what it said. It is the
health check of a container image that has no shell or curl in it:

  HEALTHCHECK CMD ["gateway", "health", "--server", "http://127.0.0.1:8080"]

--path /healthz asks only whether the process is up; /readyz (the default)
also whether its store answers and it takes work.

`

func cmdHealth(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("health", stdout, stderr, healthHelp)
	server := fs.String("server", "http://127.0.0.1:8080", "the gateway's or worker's address")
	path := fs.String("path", "/readyz", "the endpoint to ask: /readyz or /healthz")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return parseExit(err)
	}
	if len(pos) != 0 || (*path != "/readyz" && *path != "/healthz") || *timeout <= 0 {
		fs.Usage()
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	url := strings.TrimRight(*server, "/") + *path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		fmt.Fprintf(stderr, "gateway health: %v\n", err)
		return exitUsage
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "gateway health: asking %s: %v\n", url, err)
		return exitFailed
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Fprintf(stdout, "%s %s\n", resp.Status, strings.TrimSpace(string(body)))
	if resp.StatusCode != http.StatusOK {
		return exitFailed
	}
	return exitOK
}
