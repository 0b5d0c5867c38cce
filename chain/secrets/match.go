package secrets

import "slices"

// denseCells bounds the table of the matcher's dense states: 1 MiB, which
// holds every state of the forms of dozens of ordinary secrets.
const denseCells = 1 << 18

// matcher finds every place where any of a set of strings occurs in a text
// in one pass over it, whatever the number of strings (Aho-Corasick): it
// is how each byte of every step body is looked at once for every form of
// every secret.
//
// States are numbered breadth first, so the shallow ones, where a text
// leaves the matcher most of the time, come first; the first dense of them
// have a full row of next states, one load a byte. The deeper ones, which
// only a long stretch of a secret's form reaches, have their edges listed
// and a fail state to fall back to.
type matcher struct {
	// class numbers the bytes that occur in the strings from 1; a byte
	// that occurs in none is 0, and leads back to the start state.
	class   [256]int32
	classes int
	dense   int32
	// delta[s*classes+class[c]] is the state after c in a dense state s.
	delta []int32
	// The edges of a state s past the dense ones are
	// label[first[s]:first[s+1]] and the states they lead to, to[...].
	first []int32
	label []byte
	to    []int32
	// fail is the state for the longest proper suffix of what s has read
	// that is the start of a string too.
	fail []int32
	// long is the length of the longest string that ends where s has
	// read up to; 0 if none does.
	long []int32
}

// newMatcher returns a matcher for pats, none of them empty, whose dense
// states' table has at most cells entries (and at least the start state's).
func newMatcher(pats []string, cells int) *matcher {
	m := &matcher{}
	for _, p := range pats {
		for i := 0; i < len(p); i++ {
			if m.class[p[i]] == 0 {
				m.classes++
				m.class[p[i]] = int32(m.classes)
			}
		}
	}
	m.classes++

	// The trie, with each state's edges in a map while it is built.
	type node struct {
		edges map[byte]int32
		depth int32
		final bool
	}
	trie := []node{{edges: map[byte]int32{}}}
	for _, p := range pats {
		s := int32(0)
		for i := 0; i < len(p); i++ {
			t, ok := trie[s].edges[p[i]]
			if !ok {
				t = int32(len(trie))
				trie = append(trie, node{edges: map[byte]int32{}, depth: trie[s].depth + 1})
				trie[s].edges[p[i]] = t
			}
			s = t
		}
		trie[s].final = true
	}

	// Renumbered breadth first, edges in byte order so the numbering
	// does not depend on map order.
	n := len(trie)
	order := make([]int32, 0, n)
	order = append(order, 0)
	id := make([]int32, n)
	for q := 0; q < len(order); q++ {
		e := trie[order[q]].edges
		labels := make([]byte, 0, len(e))
		for c := range e {
			labels = append(labels, c)
		}
		slices.Sort(labels)
		for _, c := range labels {
			id[e[c]] = int32(len(order))
			order = append(order, e[c])
		}
	}
	edge := func(s int32, c byte) int32 { // in the new numbering; 0 for none
		if t, ok := trie[order[s]].edges[c]; ok {
			return id[t]
		}
		return 0
	}

	m.dense = int32(max(1, min(n, cells/m.classes)))
	m.delta = make([]int32, int(m.dense)*m.classes)
	m.fail = make([]int32, n)
	m.long = make([]int32, n)
	m.first = make([]int32, n+1)
	for s := range int32(n) {
		nd := trie[order[s]]
		labels := make([]byte, 0, len(nd.edges))
		for c := range nd.edges {
			labels = append(labels, c)
		}
		slices.Sort(labels)
		// Its children's fail states, from its own, which comes earlier.
		for _, c := range labels {
			t := edge(s, c)
			if s != 0 {
				f := m.fail[s]
				for f != 0 && edge(f, c) == 0 {
					f = m.fail[f]
				}
				m.fail[t] = edge(f, c)
			}
		}
		if nd.final {
			m.long[s] = nd.depth
		} else {
			m.long[s] = m.long[m.fail[s]]
		}
		if s < m.dense {
			row := m.delta[int(s)*m.classes:][:m.classes]
			if s != 0 {
				copy(row, m.delta[int(m.fail[s])*m.classes:][:m.classes])
			}
			for _, c := range labels {
				row[m.class[c]] = edge(s, c)
			}
		} else {
			for _, c := range labels {
				m.label = append(m.label, c)
				m.to = append(m.to, edge(s, c))
			}
		}
		m.first[s+1] = int32(len(m.label))
	}
	return m
}

// step is the state after reading c in a state s past the dense ones.
func (m *matcher) step(s int32, c byte) int32 {
	for s >= m.dense {
		for i := m.first[s]; i < m.first[s+1]; i++ {
			if m.label[i] == c {
				return m.to[i]
			}
		}
		s = m.fail[s]
	}
	return m.delta[int(s)*m.classes+int(m.class[c])]
}

// span is the bytes [start, end) of a text.
type span struct{ start, end int }

// addSpan adds [start, end) to spans, which are sorted and do not overlap,
// ends never decreasing from one call to the next: a span that overlaps
// those before it is joined to them, so what overlapping strings cover is
// replaced as one.
func addSpan(spans []span, start, end int) []span {
	for len(spans) > 0 && start < spans[len(spans)-1].end {
		start = min(start, spans[len(spans)-1].start)
		spans = spans[:len(spans)-1]
	}
	return append(spans, span{start, end})
}
