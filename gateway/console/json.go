package console

import (
	"bytes"
	"encoding/json"
)

// prettyJSON indents a JSON value for a page; anything else is shown as it
// is.
func prettyJSON(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return string(b)
	}
	return out.String()
}
