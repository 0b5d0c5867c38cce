package loader

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/chaingate/gateway/chain"
)

// The TOML decoder does not expose where each key is, so a light scanner
// walks the (already successfully parsed) source once and records the line
// and column of every key, table header and array element, indexed by the
// key's path in the decoded data with array-of-tables indexes resolved
// ("chains\x1f0\x1fsteps\x1f2\x1fprovider"). It only annotates errors: on
// input it does not understand it stops early and never fails the load.

const pathSep = "\x1f"

type posScanner struct {
	src  string
	i    int
	line int
	// col counts the runes read on the current line; it is kept as the
	// scanner moves, since counting from the line's start for every
	// element made long inline arrays quadratic.
	col    int
	out    chain.Positions
	arrays map[string]int // array-of-tables path → number of elements seen
}

func scanPositions(src string) (out chain.Positions) {
	defer func() {
		// Input the scanner did not foresee must cost only positions.
		if recover() != nil {
			out = chain.Positions{}
		}
	}()
	return scanPositionsStrict(src)
}

// scanPositionsStrict is scanPositions without the safety net, for tests.
func scanPositionsStrict(src string) chain.Positions {
	s := &posScanner{src: src, line: 1, out: chain.Positions{}, arrays: map[string]int{}}
	s.document()
	return s.out
}

func (s *posScanner) pos() chain.Position {
	return chain.Position{Line: s.line, Col: s.col + 1}
}

func (s *posScanner) eof() bool { return s.i >= len(s.src) }

func (s *posScanner) peek() byte {
	if s.eof() {
		return 0
	}
	return s.src[s.i]
}

func (s *posScanner) advance() {
	switch c := s.src[s.i]; {
	case c == '\n':
		s.line++
		s.col = 0
	case utf8.RuneStart(c):
		s.col++
	}
	s.i++
}

// skipSpace skips blanks and comments, and newlines too when nl is set.
func (s *posScanner) skipSpace(nl bool) {
	for !s.eof() {
		switch c := s.peek(); {
		case c == ' ' || c == '\t' || c == '\r':
			s.advance()
		case c == '\n' && nl:
			s.advance()
		case c == '#':
			for !s.eof() && s.peek() != '\n' {
				s.advance()
			}
		default:
			return
		}
	}
}

func (s *posScanner) record(path []string, p chain.Position) {
	k := chain.PosKey(path)
	if _, ok := s.out[k]; !ok {
		s.out[k] = p
	}
}

func (s *posScanner) document() {
	var table []string
	for {
		s.skipSpace(true)
		if s.eof() {
			return
		}
		if s.peek() == '[' {
			table = s.header()
			continue
		}
		before := s.i
		s.keyValue(table)
		if s.i == before {
			return
		}
	}
}

// header reads [a.b] or [[a.b]] and returns the resolved table path.
func (s *posScanner) header() []string {
	p := s.pos()
	s.advance()
	array := s.peek() == '['
	if array {
		s.advance()
	}
	keys := s.key()
	s.skipSpace(false)
	for !s.eof() && s.peek() == ']' {
		s.advance()
	}
	path := s.resolve(keys[:len(keys)-1])
	path = append(path, keys[len(keys)-1])
	// The header defines the tables above it that have no header of their
	// own ([gateway.auth] alone defines [gateway]): they are placed here.
	for i := 1; i <= len(path); i++ {
		s.record(path[:i], p)
	}
	if array {
		k := strings.Join(path, pathSep)
		n := s.arrays[k]
		s.arrays[k] = n + 1
		path = append(path, strconv.Itoa(n))
		s.record(path, p)
	}
	return path
}

// resolve turns header key segments into a data path, stepping into the
// latest element of every array of tables on the way.
func (s *posScanner) resolve(keys []string) []string {
	var path []string
	for _, k := range keys {
		path = append(path, k)
		if n, ok := s.arrays[strings.Join(path, pathSep)]; ok && n > 0 {
			path = append(path, strconv.Itoa(n-1))
		}
	}
	return path
}

func (s *posScanner) keyValue(table []string) {
	p := s.pos()
	keys := s.key()
	if len(keys) == 0 {
		s.i = len(s.src)
		return
	}
	path := append(append([]string(nil), table...), keys...)
	for i := len(table) + 1; i <= len(path); i++ {
		s.record(path[:i], p)
	}
	s.skipSpace(false)
	if s.peek() != '=' {
		s.i = len(s.src)
		return
	}
	s.advance()
	s.skipSpace(false)
	s.value(path)
}

// key reads a possibly dotted, possibly quoted key.
func (s *posScanner) key() []string {
	var keys []string
	for {
		s.skipSpace(false)
		var k string
		switch s.peek() {
		case '"':
			k = s.basicString()
		case '\'':
			k = s.literalString()
		default:
			start := s.i
			for !s.eof() && isBareKeyByte(s.peek()) {
				s.advance()
			}
			if s.i == start {
				return keys
			}
			k = s.src[start:s.i]
		}
		keys = append(keys, k)
		s.skipSpace(false)
		if s.peek() != '.' {
			return keys
		}
		s.advance()
	}
}

func isBareKeyByte(c byte) bool {
	return c == '_' || c == '-' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

func (s *posScanner) value(path []string) {
	switch {
	case strings.HasPrefix(s.src[s.i:], `"""`):
		s.multiline(`"""`, true)
	case strings.HasPrefix(s.src[s.i:], `'''`):
		s.multiline(`'''`, false)
	case s.peek() == '"':
		s.basicString()
	case s.peek() == '\'':
		s.literalString()
	case s.peek() == '[':
		s.array(path)
	case s.peek() == '{':
		s.inlineTable(path)
	default:
		for !s.eof() {
			c := s.peek()
			if c == ',' || c == ']' || c == '}' || c == '\n' || c == '#' {
				break
			}
			s.advance()
		}
	}
}

func (s *posScanner) array(path []string) {
	s.advance()
	for n := 0; ; n++ {
		s.skipSpace(true)
		if s.eof() {
			return
		}
		if s.peek() == ']' {
			s.advance()
			return
		}
		elem := append(append([]string(nil), path...), strconv.Itoa(n))
		s.record(elem, s.pos())
		before := s.i
		s.value(elem)
		s.skipSpace(true)
		if s.peek() == ',' {
			s.advance()
		} else if s.i == before {
			s.i = len(s.src)
			return
		}
	}
}

func (s *posScanner) inlineTable(path []string) {
	s.advance()
	for {
		s.skipSpace(true)
		if s.eof() {
			return
		}
		switch s.peek() {
		case '}':
			s.advance()
			return
		case ',':
			s.advance()
			continue
		}
		before := s.i
		s.keyValue(path)
		if s.i == before {
			s.i = len(s.src)
			return
		}
	}
}

func (s *posScanner) basicString() string {
	s.advance()
	var b strings.Builder
	for !s.eof() {
		c := s.peek()
		switch c {
		case '"':
			s.advance()
			return b.String()
		case '\\':
			s.advance()
			if s.eof() {
				return b.String()
			}
			e := s.peek()
			s.advance()
			switch e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'u', 'U':
				n := 4
				if e == 'U' {
					n = 8
				}
				if s.i+n <= len(s.src) {
					if r, err := strconv.ParseUint(s.src[s.i:s.i+n], 16, 32); err == nil {
						b.WriteRune(rune(r))
					}
					for range n {
						s.advance()
					}
				}
			default:
				b.WriteByte(e)
			}
		case '\n':
			return b.String()
		default:
			b.WriteByte(c)
			s.advance()
		}
	}
	return b.String()
}

func (s *posScanner) literalString() string {
	s.advance()
	start := s.i
	for !s.eof() && s.peek() != '\'' && s.peek() != '\n' {
		s.advance()
	}
	k := s.src[start:s.i]
	if !s.eof() && s.peek() == '\'' {
		s.advance()
	}
	return k
}

func (s *posScanner) multiline(delim string, escapes bool) {
	for range 3 {
		s.advance()
	}
	for !s.eof() {
		if escapes && s.peek() == '\\' {
			s.advance()
			if !s.eof() {
				s.advance()
			}
			continue
		}
		if strings.HasPrefix(s.src[s.i:], delim) {
			for range 3 {
				s.advance()
			}
			// Up to two quotes may directly precede the closing delimiter.
			for k := 0; k < 2 && !s.eof() && s.peek() == delim[0]; k++ {
				s.advance()
			}
			return
		}
		s.advance()
	}
}

// ScanPositions records the line and column of every key, table header and
// array element of a TOML document that parses, by data path, for files
// other than configs (test files) to place their problems.
func ScanPositions(src string) chain.Positions { return scanPositions(src) }
