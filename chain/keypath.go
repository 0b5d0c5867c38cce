package chain

import (
	"strconv"
	"strings"
)

// KeyPath is where a value sits in a config file, in two spellings: the
// display path used in messages (chains[incident-response].steps[notify])
// and the data path used to look up its position (chains, 0, steps, 2).
type KeyPath struct {
	disp  string
	canon []string
}

// String is the display path.
func (p KeyPath) String() string { return p.disp }

// Key is the key k of the table at p.
func (p KeyPath) Key(k string) KeyPath {
	var d string
	switch {
	case !isBareKey(k):
		// Quoted, as templates write such keys, so a '.' inside the key
		// cannot be read as a step into a table.
		d = p.disp + "[" + strconv.Quote(k) + "]"
	case p.disp == "":
		d = k
	default:
		d = p.disp + "." + k
	}
	return KeyPath{disp: d, canon: appendPath(p.canon, k)}
}

func isBareKey(k string) bool {
	return k != "" && strings.IndexFunc(k, func(r rune) bool {
		return r != '_' && r != '-' && (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9')
	}) < 0
}

// Elem is the i-th element of the array at p; name, when known, reads
// better than the index in messages.
func (p KeyPath) Elem(i int, name string) KeyPath {
	label := strconv.Itoa(i)
	if name != "" {
		label = name
	}
	return KeyPath{disp: p.disp + "[" + label + "]", canon: appendPath(p.canon, strconv.Itoa(i))}
}

// Sub extends p by a path written like `blocks[0].text` or `a["b.c"]`, as
// templates report where in a value a problem sits. On text it does not
// understand it stops, keeping the part it read.
func (p KeyPath) Sub(rel string) KeyPath {
	for rel != "" {
		switch {
		case rel[0] == '.':
			rel = rel[1:]
		case strings.HasPrefix(rel, `["`):
			q, err := strconv.QuotedPrefix(rel[1:])
			if err != nil {
				return p
			}
			k, _ := strconv.Unquote(q)
			p = p.Key(k)
			rel = strings.TrimPrefix(rel[1+len(q):], "]")
		case rel[0] == '[':
			idx, after, _ := strings.Cut(rel[1:], "]")
			i, err := strconv.Atoi(idx)
			if err != nil {
				return p
			}
			p = p.Elem(i, "")
			rel = after
		default:
			end := strings.IndexAny(rel, ".[")
			if end < 0 {
				end = len(rel)
			}
			p = p.Key(rel[:end])
			rel = rel[end:]
		}
	}
	return p
}

func appendPath(p []string, k string) []string {
	out := make([]string, len(p), len(p)+1)
	copy(out, p)
	return append(out, k)
}

// Positions are the line and column of every key, table header and array
// element of one file, by data path. The loader records them; the model
// keeps them so a problem found after loading points at its key.
type Positions map[string]Position

// Position is a line and column, both from 1.
type Position struct{ Line, Col int }

// posSep joins a data path into a Positions key.
const posSep = "\x1f"

// PosKey is the Positions key of a data path.
func PosKey(path []string) string { return strings.Join(path, posSep) }

// At is the position of p, or of the nearest enclosing key that was
// written out; 0, 0 when none was.
func (ps Positions) At(p KeyPath) (line, col int) {
	for n := len(p.canon); n > 0; n-- {
		if at, ok := ps[PosKey(p.canon[:n])]; ok {
			return at.Line, at.Col
		}
	}
	return 0, 0
}

// SourceAt is the source of p in file, whose key positions are ps.
func SourceAt(file string, ps Positions, p KeyPath) Source {
	line, col := ps.At(p)
	return Source{File: file, Line: line, Col: col, Path: p.disp, pos: ps, kp: p}
}
