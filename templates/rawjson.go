package templates

import (
	"bytes"
	"strconv"
	"unicode/utf8"
)

// RawLazy is a Lazy that holds its value as JSON text. A template that
// writes the whole value copies that text, compacted, when it already reads
// as the decoded value would be written (sorted keys, whole numbers, strings
// without escapes), and decodes it only otherwise: an item or a body passed
// on whole costs a scan, not a decode and an encode.
type RawLazy interface {
	Lazy
	RawJSON() []byte
}

// appendCanonical appends raw compacted if it reads exactly as appendJSON
// would write its decoded value; false, with buf unchanged, if not.
func appendCanonical(buf, raw []byte) ([]byte, bool) {
	c := canonical{in: raw, out: buf}
	c.skipSpace()
	if !c.value(0) {
		return buf, false
	}
	c.skipSpace()
	if c.i != len(c.in) {
		return buf, false
	}
	return c.out, true
}

type canonical struct {
	in  []byte
	i   int
	out []byte
}

func (c *canonical) skipSpace() {
	for c.i < len(c.in) {
		switch c.in[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
		default:
			return
		}
	}
}

func (c *canonical) value(depth int) bool {
	if depth > maxDepth || c.i >= len(c.in) {
		return false
	}
	switch b := c.in[c.i]; {
	case b == '"':
		_, ok := c.str()
		return ok
	case b == '{':
		return c.object(depth)
	case b == '[':
		return c.array(depth)
	case b == '-' || (b >= '0' && b <= '9'):
		return c.integer()
	}
	for _, lit := range [...]string{"true", "false", "null"} {
		if bytes.HasPrefix(c.in[c.i:], []byte(lit)) {
			c.out = append(c.out, lit...)
			c.i += len(lit)
			return true
		}
	}
	return false
}

// str copies a string that needs no escape as appendString writes it, and
// returns its contents.
func (c *canonical) str() ([]byte, bool) {
	start := c.i
	for c.i++; c.i < len(c.in); {
		b := c.in[c.i]
		switch {
		case b == '"':
			c.i++
			c.out = append(c.out, c.in[start:c.i]...)
			return c.in[start+1 : c.i-1], true
		case b == '\\' || b < 0x20:
			return nil, false
		case b < utf8.RuneSelf:
			c.i++
		default:
			r, size := utf8.DecodeRune(c.in[c.i:])
			if r == utf8.RuneError || r == '\u2028' || r == '\u2029' {
				return nil, false
			}
			c.i += size
		}
	}
	return nil, false
}

// integer copies a number that decodes to an int64 written as it stands.
func (c *canonical) integer() bool {
	start := c.i
	if c.in[c.i] == '-' {
		c.i++
	}
	for c.i < len(c.in) && c.in[c.i] >= '0' && c.in[c.i] <= '9' {
		c.i++
	}
	text := c.in[start:c.i]
	if c.i < len(c.in) {
		switch c.in[c.i] {
		case '.', 'e', 'E':
			return false
		}
	}
	n, err := strconv.ParseInt(string(text), 10, 64)
	if err != nil || len(strconv.AppendInt(nil, n, 10)) != len(text) {
		return false
	}
	c.out = append(c.out, text...)
	return true
}

func (c *canonical) object(depth int) bool {
	var prev []byte
	return c.members('}', func(n int) bool {
		if c.i >= len(c.in) || c.in[c.i] != '"' {
			return false
		}
		key, ok := c.str()
		if !ok || (n > 0 && bytes.Compare(prev, key) >= 0) {
			return false
		}
		prev = key
		c.skipSpace()
		if c.i >= len(c.in) || c.in[c.i] != ':' {
			return false
		}
		c.i++
		c.out = append(c.out, ':')
		c.skipSpace()
		return c.value(depth + 1)
	})
}

func (c *canonical) array(depth int) bool {
	return c.members(']', func(int) bool { return c.value(depth + 1) })
}

// members copies an object's or an array's opening byte, its members, each
// read by member, and its closing byte.
func (c *canonical) members(closing byte, member func(n int) bool) bool {
	c.out = append(c.out, c.in[c.i])
	c.i++
	c.skipSpace()
	if c.i < len(c.in) && c.in[c.i] == closing {
		c.i++
		c.out = append(c.out, closing)
		return true
	}
	for n := 0; ; n++ {
		if n > 0 {
			c.out = append(c.out, ',')
		}
		c.skipSpace()
		if !member(n) {
			return false
		}
		c.skipSpace()
		if c.i >= len(c.in) {
			return false
		}
		switch c.in[c.i] {
		case ',':
			c.i++
		case closing:
			c.i++
			c.out = append(c.out, closing)
			return true
		default:
			return false
		}
	}
}
