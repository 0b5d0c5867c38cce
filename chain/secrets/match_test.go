package secrets

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// naiveSpans is what matcher and addSpan must find, the slow way: every
// occurrence of every pattern, overlapping ones joined.
func naiveSpans(pats []string, text string) []span {
	var all []span
	for _, p := range pats {
		for i := 0; i+len(p) <= len(text); i++ {
			if text[i:i+len(p)] == p {
				all = append(all, span{i, i + len(p)})
			}
		}
	}
	return union(nil, all)
}

func matchSpans(m *matcher, text string) []span {
	_, spans := feed(m, 0, text, 0, len(text), 0, nil)
	return spans
}

// TestMatcher checks the matcher against a plain search on texts built of
// few letters, so patterns overlap, contain each other and share suffixes,
// with every state dense, only the start state dense, and some between.
func TestMatcher(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	word := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteByte("abc"[rng.IntN(3)])
		}
		return b.String()
	}
	for round := range 300 {
		var pats []string
		for range 1 + rng.IntN(6) {
			if p := word(1 + rng.IntN(6)); !slices.Contains(pats, p) {
				pats = append(pats, p)
			}
		}
		text := word(rng.IntN(60)) + "\x00" + word(rng.IntN(20))
		want := naiveSpans(pats, text)
		for _, cells := range []int{denseCells, 1, 12} {
			got := matchSpans(newMatcher(pats, cells), text)
			if !slices.Equal(got, want) {
				t.Fatalf("round %d, %d cells: patterns %q in %q: got %v, want %v", round, cells, pats, text, got, want)
			}
		}
	}
}
