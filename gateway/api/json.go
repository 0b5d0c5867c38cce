package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// ParseJSON checks that data is exactly one JSON value, as a run's payload
// and every request body must be, and decodes it into v unless v is nil,
// refusing fields v does not have.
func ParseJSON(data []byte, v any) error {
	if v == nil {
		// A payload is kept as sent: checking it is enough.
		if json.Valid(data) {
			return nil
		}
		v = new(json.RawMessage) // only to say what is wrong
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("more than one JSON value, or text after it")
	}
	return nil
}
