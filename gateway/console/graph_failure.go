package console

import (
	"html/template"
	"strings"

	"github.com/chaingate/gateway/chain"
	"github.com/chaingate/gateway/gateway/api"
)

// A chain's failure routes on the graph: catch edges are drawn dashed in
// the failure colour (graphSVG gives them the class "failure"), and each
// handler list (on_failure, finally) is a graph of its own under the
// chain's, titled with when it runs.

// handlerTitles say when each handler list runs.
var handlerTitles = map[string]string{
	chain.PhaseOnFailure: "on_failure — runs when the run fails",
	chain.PhaseFinally:   "finally — runs whatever the outcome",
}

// handlerGraphs draws a run's (or, with run nil, a chain's) handler lists.
func (c *console) handlerGraphs(hs []*api.DAGHandler, def *chain.Chain, run *api.RunView, runID string) template.HTML {
	var b strings.Builder
	for _, h := range hs {
		b.WriteString(`<p class="handler-title" data-phase="` + esc(h.Phase) + `">` + esc(handlerTitles[h.Phase]) + `</p>`)
		b.WriteString(string(c.graphSVG(h.Nodes, h.Edges, def, run, runID)))
	}
	return template.HTML(b.String())
}

// chainHandlers are a chain's handler lists as graphs with no run.
func chainHandlers(g *chain.Graph) []*api.DAGHandler {
	var out []*api.DAGHandler
	for _, h := range g.Handlers {
		out = append(out, &api.DAGHandler{Phase: h.Phase, Nodes: dagOf(h.Nodes), Edges: h.Edges})
	}
	return out
}

// edgeClass is the class of a routed edge.
func edgeClass(e chain.Edge) string {
	if e.Kind == chain.EdgeFailure {
		return "edge route failure"
	}
	return "edge route"
}
