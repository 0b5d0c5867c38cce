package chain

import (
	"fmt"
	"strings"
)

// Failure routes in a chain's graph: catch edges, and the handler lists.

// EdgeFailure is the kind of a catch route's edge.
const EdgeFailure = "failure"

// HandlerGraph is one of a chain's handler lists, drawn apart from its
// steps: it runs when the run fails (on_failure) or ends (finally).
type HandlerGraph struct {
	Phase string  `json:"phase"`
	Nodes []*Node `json:"nodes"`
	Edges []Edge  `json:"edges"`
}

// catchEdges are the failure edges of s's catch entries.
func catchEdges(s *Step) []Edge {
	var out []Edge
	for _, c := range s.Catch {
		label := "any failure"
		if len(c.Errors) > 0 {
			label = strings.Join(c.Errors, ", ")
		}
		if c.Recover {
			label += " (recover)"
		}
		out = append(out, Edge{From: s.Name, To: c.Target, Label: label, Kind: EdgeFailure})
	}
	return out
}

// handlerGraphs are the chain's handler lists as graphs; routes to the
// end of a handler list are left out.
func (c *Chain) handlerGraphs() []*HandlerGraph {
	var out []*HandlerGraph
	for _, phase := range []string{PhaseOnFailure, PhaseFinally} {
		steps := c.HandlerSteps(phase)
		if len(steps) == 0 {
			continue
		}
		nodes, edges := graphOf(steps)
		kept := edges[:0]
		for _, e := range edges {
			if e.To != EndTarget {
				kept = append(kept, e)
			}
		}
		out = append(out, &HandlerGraph{Phase: phase, Nodes: nodes, Edges: kept})
	}
	return out
}

// handlerTitle says when a handler list runs.
func handlerTitle(phase string) string {
	if phase == PhaseOnFailure {
		return "on_failure: when the run fails"
	}
	return "finally: whatever the outcome"
}

// writeHandlers writes the handler lists as subgraphs.
func writeHandlers(b *strings.Builder, hs []*HandlerGraph) {
	for _, h := range hs {
		fmt.Fprintf(b, "  subgraph h_%s [\"%s\"]\n", h.Phase, mermaidText(handlerTitle(h.Phase)))
		writeMermaid(b, h.Nodes, h.Edges, "    ", "end_")
		b.WriteString("  end\n")
	}
}
