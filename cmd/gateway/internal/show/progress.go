package show

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/chaingate/gateway/chain/engine"
	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/gateway/api"
)

// Progress writes one line per step event. On a terminal, a split's
// progress events rewrite one live line instead.
type Progress struct {
	w    io.Writer
	live bool

	mu      sync.Mutex
	pending bool // a live line is on screen without its newline
}

func NewProgress(w io.Writer) *Progress {
	p := &Progress{w: w}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.live = true
		}
	}
	return p
}

func (p *Progress) Print(ev api.Event) {
	line := progressLine(ev)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live && ev.Type == string(store.EventStepProgress) {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.pending = true
		return
	}
	if p.pending {
		fmt.Fprintln(p.w)
		p.pending = false
	}
	fmt.Fprintln(p.w, line)
}

func progressLine(ev api.Event) string {
	subject := ev.Step
	if subject == "" {
		subject = "run " + ev.RunID
	}
	what := strings.ReplaceAll(strings.TrimPrefix(strings.TrimPrefix(ev.Type, "step_"), "run_"), "_", " ")
	line := fmt.Sprintf("%s  %-24s %s", ev.Time.Local().Format(time.TimeOnly+".000"), subject, what)
	if ev.Attempt > 1 || (ev.Type == string(store.EventStepStarted) && ev.Attempt > 0) {
		line += fmt.Sprintf(" (attempt %d)", ev.Attempt)
	}
	if ev.Message != "" {
		line += ": " + ev.Message
	}
	return line
}

// bigBody is the size above which a step's body is written as stored, not
// indented: a split over a million items has a body of tens of megabytes,
// and indenting it took several times its size in memory, and seconds.
const bigBody = 1 << 20

// Result writes res as JSON, indented when asked. Bodies above bigBody
// are left out of the encoding and written in its place as they are: still
// one JSON document, with those bodies on one line.
func Result(w io.Writer, res *engine.Result, indent bool) error {
	var marks [][]byte
	bodies := map[string]json.RawMessage{}
	if indent {
		var nonce [8]byte
		_, _ = rand.Read(nonce[:])
		for key, st := range res.Steps {
			if len(st.Body) > bigBody {
				mark := fmt.Sprintf("@@body-%x-%d@@", nonce, len(marks))
				bodies[mark] = st.Body
				marks = append(marks, []byte(strconv.Quote(mark)))
				st.Body = json.RawMessage(strconv.Quote(mark))
				res.Steps[key] = st
			}
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if indent {
		enc.SetIndent("", "  ")
	}
	if err := enc.Encode(res); err != nil {
		return err
	}
	out := buf.Bytes()
	for len(marks) > 0 {
		i, which := -1, 0
		for n, m := range marks {
			if j := bytes.Index(out, m); j >= 0 && (i < 0 || j < i) {
				i, which = j, n
			}
		}
		if i < 0 {
			break
		}
		m := marks[which]
		if _, err := w.Write(out[:i]); err != nil {
			return err
		}
		mark, _ := strconv.Unquote(string(m))
		if _, err := w.Write(bodies[mark]); err != nil {
			return err
		}
		out = out[i+len(m):]
		marks = append(marks[:which], marks[which+1:]...)
	}
	_, err := w.Write(out)
	return err
}
