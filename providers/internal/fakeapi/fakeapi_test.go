package fakeapi_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/providers/internal/fakeapi"
)

func TestServer(t *testing.T) {
	s := fakeapi.New(func(w http.ResponseWriter, r *http.Request, body []byte) int {
		return fakeapi.WriteJSON(w, http.StatusAccepted, map[string]string{"got": string(body)})
	})
	defer s.Close()
	post := func(body string) (int, string, string) {
		t.Helper()
		resp, err := http.Post(s.URL+"/p/a%2Fb?q=1", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Retry-After"), string(data)
	}

	s.FailNext(2, fakeapi.Fault{Status: 429, RetryAfter: "3", Body: "slow down"})
	s.FailNext(1, fakeapi.Fault{Status: 503})
	for i, want := range []struct {
		status     int
		retryAfter string
		body       string
	}{
		{429, "3", "slow down"},
		{429, "3", "slow down"},
		{503, "", ""},
		{202, "", `{"got":"x"}`},
	} {
		if status, ra, body := post("x"); status != want.status || ra != want.retryAfter || body != want.body {
			t.Errorf("request %d: %d %q %q, want %+v", i, status, ra, body, want)
		}
	}
	reqs := s.Requests()
	if len(reqs) != 4 || reqs[0].Path != "/p/a%2Fb" || reqs[0].Query != "q=1" || string(reqs[0].Body) != "x" || reqs[0].Answer != 429 || reqs[3].Answer != 202 {
		t.Errorf("requests = %+v", reqs)
	}

	s.Reset()
	s.Record(false)
	post("y")
	if s.Count() != 1 || len(s.Requests()) != 0 {
		t.Errorf("with recording off: count %d, %d requests recorded", s.Count(), len(s.Requests()))
	}

	// A slow answer ends when the client gives up.
	s.SetLatency(time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, nil)
	start := time.Now()
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Error("a slow answer arrived")
	}
	s.Close() // waits for the handler
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the handler held on for %v", d)
	}
}
