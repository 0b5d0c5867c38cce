package console

import (
	"fmt"
	"html"
	"html/template"
	"net/url"
	"strconv"
	"strings"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/gateway/api"
	"github.com/chaingate/gateway/internal/textx"
)

// The run page draws a chain as SVG, top to bottom, one box per top-level
// step. A parallel group is one box holding its sub-steps side by side, with
// its join and failure policy; a split is one box with a stacked bar of its
// items' outcomes, however many items it has, so the page's size does not
// grow with them.

const (
	gNodeW   = 300
	gNodeH   = 50
	gGap     = 34
	gLeft    = 20
	gChildW  = 150
	gChildH  = 42
	gBarH    = 12
	gRouteDX = 40
)

type placedNode struct {
	node *api.DAGNode
	y, h int
	w    int
}

// graphSVG renders nodes; run is nil on a chain's page, and then nothing
// links to a step. The steps are a list to a screen reader, a group's
// sub-steps a list inside its item, each step named with its status; on a
// run's page each is a link that Tab reaches, with the id by which "jump to
// the running step" finds it.
func (c *console) graphSVG(nodes []*api.DAGNode, edges []chain.Edge, def *chain.Chain, run *api.RunView, runID string) template.HTML {
	var b strings.Builder
	b.Grow(len(nodes) * 500)
	// Each step links to its panel under the run's address.
	stepsHref := ""
	if run != nil {
		stepsHref = c.base + "/runs/" + url.PathEscape(runID) + "/steps/"
	}
	placed := map[string]*placedNode{}
	y := 10
	width := gLeft + gNodeW
	var order []*placedNode
	for _, n := range nodes {
		p := &placedNode{node: n, y: y, h: gNodeH, w: gNodeW}
		switch {
		case n.Kind == "parallel":
			p.h = gNodeH + gChildH + 14
			p.w = max(gNodeW, len(n.Children)*(gChildW+10)+10)
		case n.Kind == "split":
			p.h = gNodeH + gBarH + 18
		}
		width = max(width, gLeft+p.w)
		placed[n.Name] = p
		order = append(order, p)
		y += p.h + gGap
	}
	height := max(y-gGap+10, 60)
	// The edges first, since the routes on the right decide the width: a
	// chain without branches or jumps needs no room for them, and fits a
	// phone.
	var lines strings.Builder
	routes, right := 0, width
	for _, e := range edges {
		from, to := placed[e.From], placed[e.To]
		if from == nil || to == nil {
			continue
		}
		if to.y == from.y+from.h+gGap && e.Label == "" {
			lines.WriteString(`<line class="edge"`)
			attrInt(&lines, "x1", gLeft+gNodeW/2)
			attrInt(&lines, "y1", from.y+from.h)
			attrInt(&lines, "x2", gLeft+gNodeW/2)
			attrInt(&lines, "y2", to.y)
			lines.WriteString(` marker-end="url(#arrow)"/>`)
			continue
		}
		// A branch, or a jump past the next step: routed on the right.
		routes++
		rx := gLeft + max(from.w, to.w) + routes*gRouteDX/2 + 10
		fy, ty := from.y+from.h/2, to.y+to.h/2
		fmt.Fprintf(&lines, `<path class="%s" d="M%d,%d H%d V%d H%d" marker-end="url(#arrow)"/>`, edgeClass(e), gLeft+from.w, fy, rx, ty, gLeft+to.w)
		right = max(right, rx+10)
		if e.Label != "" {
			label := textx.Short(e.Label, 28)
			fmt.Fprintf(&lines, `<text class="route-label" x="%d" y="%d">%s</text>`, rx+4, (fy+ty)/2, esc(label))
			right = max(right, rx+4+7*len([]rune(label)))
		}
	}
	width = right + 10
	what := "steps of the chain"
	if run != nil {
		what = "steps of the run"
	}
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="%d" height="%d" viewBox="0 0 %d %d" role="list" aria-label="%s">`, width, height, width, height, what)
	b.WriteString(`<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" class="arrowhead"/></marker></defs>`)
	// The arrows say what the list's order and the steps' names say.
	b.WriteString(`<g aria-hidden="true">`)
	b.WriteString(lines.String())
	b.WriteString(`</g>`)
	for _, p := range order {
		c.drawNode(&b, p, def, run, runID, stepsHref)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// stepLabel is a step's accessible name: its name, its status first of
// all, then what it is. The page's script keeps the status current as the
// step changes.
func stepLabel(name, status, what string, attempts int) string {
	label := name
	if status != "" {
		label += ": " + statusWord(status)
	}
	if attempts > 1 {
		label += fmt.Sprintf(" · %d attempts", attempts)
	}
	if what != "" {
		label += " · " + what
	}
	return label
}

func (c *console) drawNode(b *strings.Builder, p *placedNode, def *chain.Chain, run *api.RunView, runID, stepsHref string) {
	n := p.node
	status := n.Status
	href := ""
	if stepsHref != "" {
		href = stepsHref + n.Name
	}
	title := n.Name
	kind := n.Kind
	if n.Provider != "" {
		kind += " · " + n.Provider
	}
	detail := kind
	if status != "" {
		detail += " · " + statusWord(status)
		if n.Attempts > 1 {
			detail += fmt.Sprintf(" · %d attempts", n.Attempts)
		}
	}
	if n.Kind == "parallel" {
		kind = "parallel · join " + n.Join
		if def != nil {
			if s := def.Step(n.Name); s != nil && s.Parallel != nil {
				kind += " · " + string(s.Parallel.OnFailure)
			}
		}
		detail = kind
		if status != "" {
			detail += " · " + statusWord(status)
		}
	}
	b.WriteString(`<g role="listitem">`)
	openNode(b, href, "node st-"+statusClass(status), n.Name, n.Name, stepLabel(n.Name, status, kind, n.Attempts))
	rect(b, "", gLeft, p.y, p.w, p.h, 6)
	text(b, "name", gLeft+10, p.y+20, textx.Short(title, 36))
	text(b, "detail", gLeft+10, p.y+38, textx.Short(detail, 48))
	closeLink(b, href)
	if n.ChildRun != "" && run != nil {
		childHref := c.base + "/runs/" + url.PathEscape(n.ChildRun)
		openLink(b, childHref, "child-link", "child run "+n.ChildRun)
		fmt.Fprintf(b, `<text x="%d" y="%d">child run →</text>`, gLeft+p.w-90, p.y+20)
		closeLink(b, childHref)
	}
	switch n.Kind {
	case "parallel":
		fmt.Fprintf(b, `<g role="list" aria-label="steps of group %s">`, esc(n.Name))
		for i, ch := range n.Children {
			x := gLeft + 10 + i*(gChildW+10)
			cy := p.y + gNodeH
			chHref := ""
			if stepsHref != "" {
				chHref = stepsHref + n.Name + "/" + ch.Name
			}
			sub := ch.Kind
			if ch.Provider != "" {
				sub += " · " + ch.Provider
			}
			b.WriteString(`<g role="listitem">`)
			openNode(b, chHref, "node sub st-"+statusClass(ch.Status), ch.Name, n.Name+"/"+ch.Name, stepLabel(ch.Name, ch.Status, sub, ch.Attempts))
			rect(b, "", x, cy, gChildW, gChildH, 5)
			text(b, "name", x+8, cy+17, textx.Short(ch.Name, 18))
			if ch.Status != "" {
				sub = statusWord(ch.Status)
			}
			text(b, "detail", x+8, cy+33, textx.Short(sub, 20))
			closeLink(b, chHref)
			b.WriteString(`</g>`)
		}
		b.WriteString(`</g>`)
	case "split":
		c.drawSplitBar(b, p, run, runID)
	}
	b.WriteString(`</g>`)
}

// drawSplitBar draws a split's items as one stacked bar: succeeded,
// failed, skipped (filtered), running, pending.
func (c *console) drawSplitBar(b *strings.Builder, p *placedNode, run *api.RunView, runID string) {
	s := p.node.Split
	x, y, w := gLeft+10, p.y+gNodeH-4, p.w-20
	if s == nil || s.Total == 0 {
		rect(b, "bar pending", x, y, w, gBarH, 0)
		return
	}
	processed := s.Succeeded + s.Failed + s.Skipped
	running := 0
	if !s.Distributed && p.node.Status == "running" {
		running = max(min(s.Next, s.Total)-processed, 0)
	}
	parts := []struct {
		class string
		n     int
	}{{"succeeded", s.Succeeded}, {"failed", s.Failed}, {"skipped", s.Skipped}, {"running", running}, {"pending", s.Total - processed - running}}
	href := c.base + "/runs/" + url.PathEscape(runID) + "/items/" + p.node.Name
	label := fmt.Sprintf("%d/%d items: %d succeeded, %d failed, %d filtered", processed, s.Total, s.Succeeded, s.Failed, s.Skipped)
	if s.Distributed {
		label += " · on workers"
	}
	fmt.Fprintf(b, `<a href="%s" class="split-bar" data-key="%s" data-x="%d" data-w="%d" data-total="%d" data-distributed="%t"><title>%s</title>`,
		esc(href), esc(p.node.Name), x, w, s.Total, s.Distributed, esc(label))
	at := x
	for i, part := range parts {
		pw := part.n * w / s.Total
		if i == len(parts)-1 {
			pw = x + w - at
		}
		fmt.Fprintf(b, `<rect class="bar %s" x="%d" y="%d" width="%d" height="%d"><title>%d %s</title></rect>`, part.class, at, y, max(pw, 0), gBarH, part.n, part.class)
		at += pw
	}
	text(b, "bar-label", x, y+gBarH+12, label)
	b.WriteString(`</a>`)
}

// openNode opens a step's node: a link on a run's page, a picture with a
// name on a chain's. data-key is the step's record key, by which the page's
// script finds it when an event names the step.
func openNode(b *strings.Builder, href, class, title, key, label string) {
	if href != "" {
		b.WriteString(`<a href="`)
		escTo(b, href)
		b.WriteString(`" id="step-`)
		escTo(b, key)
		b.WriteString(`" class="`)
	} else {
		b.WriteString(`<g role="img" class="`)
	}
	escTo(b, class)
	b.WriteString(`" data-key="`)
	escTo(b, key)
	b.WriteString(`" aria-label="`)
	escTo(b, label)
	b.WriteString(`"><title>`)
	escTo(b, title)
	b.WriteString(`</title>`)
}

// rect and text write the graph's most frequent elements; a page draws
// hundreds of them, and fmt's formatting was most of what drawing cost.
func rect(b *strings.Builder, class string, x, y, w, h, rx int) {
	b.WriteString(`<rect`)
	if class != "" {
		b.WriteString(` class="`)
		b.WriteString(class)
		b.WriteByte('"')
	}
	attrInt(b, "x", x)
	attrInt(b, "y", y)
	attrInt(b, "width", w)
	attrInt(b, "height", h)
	if rx > 0 {
		attrInt(b, "rx", rx)
	}
	b.WriteString(`/>`)
}

func text(b *strings.Builder, class string, x, y int, s string) {
	b.WriteString(`<text class="`)
	b.WriteString(class)
	b.WriteByte('"')
	attrInt(b, "x", x)
	attrInt(b, "y", y)
	b.WriteByte('>')
	escTo(b, s)
	b.WriteString(`</text>`)
}

func attrInt(b *strings.Builder, name string, n int) {
	var buf [20]byte
	b.WriteByte(' ')
	b.WriteString(name)
	b.WriteString(`="`)
	b.Write(strconv.AppendInt(buf[:0], int64(n), 10))
	b.WriteByte('"')
}

var htmlEscaper = strings.NewReplacer(`&`, "&amp;", `'`, "&#39;", `<`, "&lt;", `>`, "&gt;", `"`, "&#34;")

// escTo writes s escaped for HTML, as html.EscapeString would return it.
func escTo(b *strings.Builder, s string) { _, _ = htmlEscaper.WriteString(b, s) }

func openLink(b *strings.Builder, href, class, title string) {
	if href != "" {
		fmt.Fprintf(b, `<a href="%s" class="%s"><title>%s</title>`, esc(href), esc(class), esc(title))
		return
	}
	fmt.Fprintf(b, `<g class="%s"><title>%s</title>`, esc(class), esc(title))
}

func closeLink(b *strings.Builder, href string) {
	if href != "" {
		b.WriteString(`</a>`)
		return
	}
	b.WriteString(`</g>`)
}

func esc(s string) string { return html.EscapeString(s) }

func statusClass(s string) string {
	if s == "" {
		return "none"
	}
	return strings.ReplaceAll(s, "_", "-")
}

func statusWord(s string) string { return strings.ReplaceAll(s, "_", " ") }
