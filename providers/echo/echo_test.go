package echo_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/chaingate/gateway/providers"
	"github.com/chaingate/gateway/providers/echo"
)

func TestExecute(t *testing.T) {
	for _, tc := range []struct {
		name, payload, want string
	}{
		{"object", `{"a":1,"b":[true,null]}`, `{"a":1,"b":[true,null]}`},
		{"array", `[1,"two"]`, `[1,"two"]`},
		{"string", `"hi"`, `"hi"`},
		{"null", `null`, `null`},
		{"empty is null", ``, `null`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := echo.New().Execute(context.Background(), providers.Request{Payload: json.RawMessage(tc.payload)})
			if err != nil {
				t.Fatal(err)
			}
			if string(resp.Body) != tc.want {
				t.Errorf("body = %s, want %s", resp.Body, tc.want)
			}
		})
	}
}

func TestDescribe(t *testing.T) {
	info, err := echo.New().Describe(context.Background())
	if err != nil || info.Name != "echo" {
		t.Errorf("Describe = %+v, %v", info, err)
	}
}
