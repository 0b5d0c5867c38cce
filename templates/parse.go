package templates

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
)

// roots are the names a path may start with, in the order error messages list them.
var roots = []string{"origin", "steps", "prev", "run", "chain", "result", "item", "item_index", "secrets", "failure"}

type segKind uint8

const (
	segKey   segKind = iota // .name or ["name"]: map key only
	segNum                  // .0: array index on arrays, key "0" on maps
	segIndex                // [0]: array index only
)

type segment struct {
	key  string // as written; the map key for segKey and segNum
	idx  int    // array index for segNum and segIndex
	kind segKind
}

type path struct {
	root string
	segs []segment
	text string
}

// operand is a path or, when path is nil, a literal.
type operand struct {
	path *path
	lit  any
}

type expr struct {
	ops  []operand
	text string // between << and >>, trimmed; names the expression in errors
}

// hasPaths reports whether the expression depends on the scope at all.
func (e *expr) hasPaths() bool {
	for _, op := range e.ops {
		if op.path != nil {
			return true
		}
	}
	return false
}

// piece is literal text followed by a placeholder; e is nil only for the trailing text.
type piece struct {
	lit string
	e   *expr
}

// syntaxError is a template string error before the key path is known.
type syntaxError struct {
	off int
	msg string
}

// scan splits s into literal text and parsed placeholders whose paths
// start at one of roots (the chain roots when nil).
func scan(s string, roots []string) ([]piece, *syntaxError) {
	var pieces []piece
	i := 0
	for {
		j := strings.Index(s[i:], "<<")
		if j < 0 {
			return append(pieces, piece{lit: s[i:]}), nil
		}
		p := parser{s: s, pos: i + j + 2, roots: roots}
		e, err := p.expr(i + j)
		if err != nil {
			return nil, err
		}
		pieces = append(pieces, piece{lit: s[i : i+j], e: e})
		i = p.pos
	}
}

type parser struct {
	s     string
	pos   int
	roots []string
}

func (p *parser) errf(off int, msg string) *syntaxError {
	return &syntaxError{off: off, msg: msg}
}

func (p *parser) skipSpace() {
	for p.pos < len(p.s) {
		switch p.s[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) at(tok string) bool { return strings.HasPrefix(p.s[p.pos:], tok) }

// expr parses from just after the "<<" at start up to and including the closing ">>".
func (p *parser) expr(start int) (*expr, *syntaxError) {
	// A missing ">>" is the likeliest mistake, so report it ahead of whatever the
	// following text happens to trip over.
	if !strings.Contains(p.s[p.pos:], ">>") {
		return nil, p.errf(start, "unterminated placeholder")
	}
	e := &expr{}
	p.skipSpace()
	if p.at(">>") {
		return nil, p.errf(start, "empty placeholder")
	}
	for {
		if p.pos >= len(p.s) {
			return nil, p.errf(start, "unterminated placeholder")
		}
		op, err := p.operand()
		if err != nil {
			return nil, err
		}
		e.ops = append(e.ops, op)
		p.skipSpace()
		switch {
		case p.pos >= len(p.s):
			return nil, p.errf(start, "unterminated placeholder")
		case p.at(">>"):
			p.pos += 2
			e.text = strings.Trim(p.s[start+2:p.pos-2], " \t\r\n")
			return e, nil
		case p.at("??"):
			at := p.pos
			p.pos += 2
			p.skipSpace()
			if p.at(">>") {
				return nil, p.errf(at, "nothing after ??")
			}
		default:
			return nil, p.errf(p.pos, "unexpected "+quoteByte(p.s[p.pos])+", want ?? or >>")
		}
	}
}

func (p *parser) operand() (operand, *syntaxError) {
	c := p.s[p.pos]
	switch {
	case c == '"':
		s, err := p.stringLit()
		return operand{lit: s}, err
	case c == '-' || isDigit(c):
		n, err := p.number()
		return operand{lit: n}, err
	case isNameByte(c):
		start := p.pos
		name := p.name()
		switch name {
		case "true":
			return operand{lit: true}, nil
		case "false":
			return operand{lit: false}, nil
		case "null":
			return operand{lit: nil}, nil
		}
		pa, err := p.path(start, name)
		return operand{path: pa}, err
	}
	return operand{}, p.errf(p.pos, "unexpected "+quoteByte(c)+", want a path or a JSON literal")
}

func (p *parser) name() string {
	start := p.pos
	for p.pos < len(p.s) && isNameByte(p.s[p.pos]) {
		p.pos++
	}
	return p.s[start:p.pos]
}

func (p *parser) path(start int, root string) (*path, *syntaxError) {
	valid := p.roots
	if valid == nil {
		valid = roots
	}
	if !slices.Contains(valid, root) {
		return nil, p.errf(start, "unknown root "+strconv.Quote(root)+" (valid roots: "+strings.Join(valid, ", ")+")")
	}
	pa := &path{root: root}
	for p.pos < len(p.s) {
		switch p.s[p.pos] {
		case '.':
			p.pos++
			at := p.pos
			name := p.name()
			if name == "" {
				return nil, p.errf(at, "expected a name after '.'")
			}
			seg := segment{key: name, kind: segKey}
			if allDigits(name) {
				idx, err := strconv.Atoi(name)
				if err != nil {
					return nil, p.errf(at, "index "+name+" out of range")
				}
				seg.kind, seg.idx = segNum, idx
			}
			pa.segs = append(pa.segs, seg)
		case '[':
			p.pos++
			seg, err := p.bracket()
			if err != nil {
				return nil, err
			}
			pa.segs = append(pa.segs, seg)
		default:
			pa.text = p.s[start:p.pos]
			return pa, nil
		}
	}
	pa.text = p.s[start:p.pos]
	return pa, nil
}

// bracket parses `0]` or `"key"]`, just after the '['.
func (p *parser) bracket() (segment, *syntaxError) {
	at := p.pos
	var seg segment
	switch {
	case p.at(`"`):
		key, err := p.stringLit()
		if err != nil {
			return seg, err
		}
		seg = segment{key: key, kind: segKey}
	case p.pos < len(p.s) && isDigit(p.s[p.pos]):
		for p.pos < len(p.s) && isDigit(p.s[p.pos]) {
			p.pos++
		}
		digits := p.s[at:p.pos]
		idx, err := strconv.Atoi(digits)
		if err != nil {
			return seg, p.errf(at, "index "+digits+" out of range")
		}
		seg = segment{key: digits, idx: idx, kind: segIndex}
	default:
		return seg, p.errf(at, `expected an index or a quoted key after '['`)
	}
	if !p.at("]") {
		return seg, p.errf(p.pos, "expected ']'")
	}
	p.pos++
	return seg, nil
}

func (p *parser) stringLit() (string, *syntaxError) {
	start := p.pos
	for j := start + 1; j < len(p.s); j++ {
		switch p.s[j] {
		case '\\':
			j++
		case '"':
			var out string
			if json.Unmarshal([]byte(p.s[start:j+1]), &out) != nil {
				return "", p.errf(start, "invalid string literal")
			}
			p.pos = j + 1
			return out, nil
		}
	}
	return "", p.errf(start, "unterminated string literal")
}

func (p *parser) number() (any, *syntaxError) {
	start := p.pos
	end := numberEnd(p.s, start)
	if end < 0 || (end < len(p.s) && (isNameByte(p.s[end]) || p.s[end] == '.')) {
		return nil, p.errf(start, "invalid number literal")
	}
	p.pos = end
	text := p.s[start:end]
	if !strings.ContainsAny(text, ".eE") {
		if n, err := strconv.ParseInt(text, 10, 64); err == nil {
			return n, nil
		}
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil {
		return nil, p.errf(start, "number literal "+text+" out of range")
	}
	return f, nil
}

// numberEnd returns the end of the JSON number starting at s[i], or -1 if there is none.
func numberEnd(s string, i int) int {
	digits := func() bool {
		start := i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		return i > start
	}
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case !digits():
		return -1
	}
	if i < len(s) && s[i] == '.' {
		i++
		if !digits() {
			return -1
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if !digits() {
			return -1
		}
	}
	return i
}

func isJSONNumber(s string) bool { return numberEnd(s, 0) == len(s) }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isNameByte(c byte) bool {
	return isDigit(c) || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || c == '-'
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return s != ""
}

func quoteByte(c byte) string {
	if c < 0x80 {
		return strconv.QuoteRune(rune(c))
	}
	return "byte 0x" + strconv.FormatUint(uint64(c), 16)
}
