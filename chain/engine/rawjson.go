package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/chaingate/gateway/internal/jsonx"
)

// A payload is stored as the JSON it came as, already checked when the run
// started. These functions find a part of it without decoding the rest: a
// million-item array under origin.payload is indexed, not turned into a
// million maps.

var errRawJSON = errors.New("malformed JSON")

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the index just past the JSON value starting at b[i].
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errRawJSON
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				end, err := skipString(b, i)
				if err != nil {
					return 0, err
				}
				i = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, nil
				}
			}
			i++
		}
		return 0, errRawJSON
	}
	// A number, true, false or null.
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i, nil
		}
		i++
	}
	return i, nil
}

func skipString(b []byte, i int) (int, error) {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1, nil
		}
	}
	return 0, errRawJSON
}

// rawField returns the raw value of field name in the JSON object b, and
// whether b is an object that has it. Of a key written twice, the last
// counts, as when decoding.
func rawField(b []byte, name string) ([]byte, bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	var found []byte
	ok := false
	i++
	if j := skipSpace(b, i); j < len(b) && b[j] == '}' {
		return nil, false
	}
	for {
		i = skipSpace(b, i)
		if i >= len(b) || b[i] != '"' {
			return nil, false
		}
		end, err := skipString(b, i)
		if err != nil {
			return nil, false
		}
		key := b[i+1 : end-1]
		match := string(key) == name
		if !match && containsByte(key, '\\') {
			// An escaped key: compare what it says.
			var k string
			match = json.Unmarshal(b[i:end], &k) == nil && k == name
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		i = skipSpace(b, i+1)
		vend, err := skipValue(b, i)
		if err != nil {
			return nil, false
		}
		if match {
			found, ok = b[i:vend], true
		}
		i = skipSpace(b, vend)
		if i < len(b) && b[i] == '}' {
			return found, ok
		}
		if i >= len(b) || b[i] != ',' {
			return nil, false
		}
		i++
	}
}

func containsByte(b []byte, c byte) bool {
	for _, x := range b {
		if x == c {
			return true
		}
	}
	return false
}

// rawIndex returns element n of the JSON array b.
func rawIndex(b []byte, n int) ([]byte, bool) {
	found := []byte(nil)
	ok := false
	_ = eachElement(b, func(i int, elem []byte) bool {
		if i == n {
			found, ok = elem, true
			return false
		}
		return true
	})
	return found, ok
}

// eachElement calls fn with each element of the JSON array b, until fn
// returns false; it fails when b is not an array.
func eachElement(b []byte, fn func(i int, elem []byte) bool) error {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return errRawJSON
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return nil
	}
	for n := 0; ; n++ {
		i = skipSpace(b, i)
		end, err := skipValue(b, i)
		if err != nil {
			return err
		}
		if !fn(n, b[i:end]) {
			return nil
		}
		i = skipSpace(b, end)
		if i >= len(b) {
			return errRawJSON
		}
		if b[i] == ']' {
			return nil
		}
		if b[i] != ',' {
			return errRawJSON
		}
		i++
	}
}

// rawPath follows keys and indexes (as decimal strings) into b.
func rawPath(b []byte, path []string) ([]byte, bool) {
	for _, seg := range path {
		if v, ok := rawField(b, seg); ok {
			b = v
			continue
		}
		n, err := strconv.Atoi(seg)
		if err != nil {
			return nil, false
		}
		v, ok := rawIndex(b, n)
		if !ok {
			return nil, false
		}
		b = v
	}
	return b, true
}

// ItemList is a split's rendered items, in order.
type ItemList interface {
	Len() int
	// At is item i as templates and conditions read it.
	At(i int) any
	// JSON is item i as JSON, as a worker is sent it.
	JSON(i int) (json.RawMessage, error)
}

// valueItems are items rendered to values.
type valueItems []any

func (v valueItems) Len() int     { return len(v) }
func (v valueItems) At(i int) any { return v[i] }
func (v valueItems) JSON(i int) (json.RawMessage, error) {
	b, err := jsonx.Marshal(v[i])
	if err != nil {
		return nil, fmt.Errorf("encoding item %d: %w", i, err)
	}
	return b, nil
}

// rawItems are an array of the run's payload, kept as the raw JSON it came
// as with the bounds of each element: about 8 bytes an item on top of the
// payload the run holds anyway, each item decoded when something reads it.
type rawItems struct {
	raw  []byte
	ends []uint32 // ends[2i], ends[2i+1]: item i's bounds in raw
}

func (r *rawItems) Len() int { return len(r.ends) / 2 }
func (r *rawItems) At(i int) any {
	return &lazyJSON{raw: r.raw[r.ends[2*i]:r.ends[2*i+1]]}
}
func (r *rawItems) JSON(i int) (json.RawMessage, error) {
	return r.raw[r.ends[2*i]:r.ends[2*i+1]], nil
}

// indexItems indexes the JSON array arr, a part of raw; false when arr is
// not an array, or too large to index in 32 bits.
func indexItems(raw, arr []byte) (*rawItems, bool) {
	if len(raw) > math.MaxUint32 {
		return nil, false
	}
	items := &rawItems{raw: raw}
	err := eachElement(arr, func(_ int, elem []byte) bool {
		// elem lies in raw's memory: its offset is what its capacity lacks.
		start := cap(raw) - cap(elem)
		items.ends = append(items.ends, uint32(start), uint32(start+len(elem)))
		return true
	})
	if err != nil {
		return nil, false
	}
	return items, true
}
