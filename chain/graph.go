package chain

import (
	"fmt"
	"strings"
)

// Graph is a chain's steps as nodes and the routes between them as edges,
// for the API and for drawing.
type Graph struct {
	Nodes []*Node `json:"nodes"`
	Edges []Edge  `json:"edges"`
	// Handlers are the chain's on_failure and finally lists.
	Handlers []*HandlerGraph `json:"handlers,omitempty"`
}

// Node is one step.
type Node struct {
	Name     string  `json:"name"`
	Kind     string  `json:"kind"`
	Provider string  `json:"provider,omitempty"`
	Action   string  `json:"action_type,omitempty"`
	SubChain string  `json:"sub_chain,omitempty"`
	When     string  `json:"when,omitempty"`
	Join     string  `json:"join,omitempty"`
	Items    string  `json:"items,omitempty"`
	Children []*Node `json:"children,omitempty"`
	// Edges are the routes between a split's per-item steps.
	Edges []Edge `json:"edges,omitempty"`
}

// Edge is a route from one step to the next.
type Edge struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Label is the branch condition, "default" for default_next, empty for
	// the next step in order; for a failure edge, the errors it catches.
	Label string `json:"label,omitempty"`
	// Kind is EdgeFailure for a catch route, empty for the others.
	Kind string `json:"kind,omitempty"`
}

// Graph returns the chain's graph. Routes to the end of a list point at
// EndTarget.
func (c *Chain) Graph() *Graph {
	nodes, edges := graphOf(c.Steps)
	return &Graph{Nodes: nodes, Edges: edges, Handlers: c.handlerGraphs()}
}

func graphOf(steps []*Step) ([]*Node, []Edge) {
	var nodes []*Node
	var edges []Edge
	for _, s := range steps {
		n := &Node{Name: s.Name, Kind: s.Kind.String(), Provider: s.Provider, Action: s.ActionType, SubChain: s.SubChain}
		if s.When != nil {
			n.When = s.When.String()
		}
		if p := s.Parallel; p != nil {
			n.Join = string(p.Join)
			n.Children, _ = graphOf(p.Steps)
		}
		if sp := s.Split; sp != nil {
			if refs := sp.Items.Refs(); len(refs) > 0 {
				n.Items = refs[0].Text
			}
			n.Children, n.Edges = graphOf(sp.Steps)
		}
		nodes = append(nodes, n)
		for _, b := range s.Branches {
			edges = append(edges, Edge{From: s.Name, To: b.Target, Label: b.Cond.String()})
		}
		edges = append(edges, catchEdges(s)...)
		switch next := s.Next(); {
		case s.DefaultNext != "":
			edges = append(edges, Edge{From: s.Name, To: s.DefaultNext, Label: "default"})
		case next != nil:
			edges = append(edges, Edge{From: s.Name, To: next.Name})
		default:
			edges = append(edges, Edge{From: s.Name, To: EndTarget})
		}
	}
	return nodes, edges
}

// Mermaid renders the chain as a Mermaid flowchart: parallel groups and
// splits as subgraphs, branches as labelled edges.
func (c *Chain) Mermaid() string {
	var b strings.Builder
	b.WriteString("flowchart TD\n")
	fmt.Fprintf(&b, "  start([%s]) --> %s\n", mermaidText(c.Name), mermaidID(c.Steps[0].Name))
	g := c.Graph()
	writeMermaid(&b, g.Nodes, g.Edges, "  ", "end_")
	b.WriteString("  end_([end])\n")
	writeHandlers(&b, g.Handlers)
	return b.String()
}

// writeMermaid writes nodes and edges; routes to the end of the list go to
// endID.
func writeMermaid(b *strings.Builder, nodes []*Node, edges []Edge, indent, endID string) {
	for _, n := range nodes {
		id := mermaidID(n.Name)
		switch n.Kind {
		case "parallel":
			fmt.Fprintf(b, "%ssubgraph %s [\"%s (parallel, join %s)\"]\n", indent, id, mermaidText(n.Name), n.Join)
			for _, c := range n.Children {
				fmt.Fprintf(b, "%s  %s[\"%s\"]\n", indent, mermaidID(n.Name+"/"+c.Name), mermaidText(label(c)))
			}
			fmt.Fprintf(b, "%send\n", indent)
		case "split":
			fmt.Fprintf(b, "%ssubgraph %s [\"%s (for each of %s)\"]\n", indent, id, mermaidText(n.Name), mermaidText(n.Items))
			done := mermaidID(n.Name + "/" + EndTarget)
			writeMermaid(b, prefixed(n.Name, n.Children), prefixedEdges(n.Name, n.Edges), indent+"  ", done)
			fmt.Fprintf(b, "%s  %s([item done])\n", indent, done)
			fmt.Fprintf(b, "%send\n", indent)
		default:
			fmt.Fprintf(b, "%s%s[\"%s\"]\n", indent, id, mermaidText(label(n)))
		}
	}
	for _, e := range edges {
		to := mermaidID(e.To)
		if e.To == EndTarget || strings.HasSuffix(e.To, "/"+EndTarget) {
			to = endID
		}
		if e.Kind == EdgeFailure {
			fmt.Fprintf(b, "%s%s -.->|%s| %s\n", indent, mermaidID(e.From), mermaidText(e.Label), to)
		} else if e.Label != "" {
			fmt.Fprintf(b, "%s%s -->|%s| %s\n", indent, mermaidID(e.From), mermaidText(e.Label), to)
		} else {
			fmt.Fprintf(b, "%s%s --> %s\n", indent, mermaidID(e.From), to)
		}
	}
}

func prefixed(prefix string, nodes []*Node) []*Node {
	out := make([]*Node, len(nodes))
	for i, n := range nodes {
		c := *n
		c.Name = prefix + "/" + n.Name
		out[i] = &c
	}
	return out
}

func prefixedEdges(prefix string, edges []Edge) []Edge {
	out := make([]Edge, len(edges))
	for i, e := range edges {
		out[i] = Edge{From: prefix + "/" + e.From, To: prefix + "/" + e.To, Label: e.Label}
	}
	return out
}

func label(n *Node) string {
	name := n.Name[strings.LastIndexByte(n.Name, '/')+1:]
	switch {
	case n.SubChain != "":
		return fmt.Sprintf("%s → chain %s", name, n.SubChain)
	case n.Provider != "":
		return fmt.Sprintf("%s (%s)", name, n.Provider)
	}
	return name
}

// mermaidID makes a name safe as a Mermaid node id.
func mermaidID(name string) string {
	var b strings.Builder
	b.WriteString("s_")
	for _, r := range name {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			fmt.Fprintf(&b, "_%x_", r)
		}
	}
	return b.String()
}

// mermaidText makes text safe inside a quoted Mermaid label.
func mermaidText(s string) string {
	return strings.NewReplacer(`"`, "#quot;", "|", "#124;", "<", "#lt;", ">", "#gt;").Replace(s)
}
