package store_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store"
	"github.com/chaingate/gateway/internal/jsonx"
)

// TestMarshalStep encodes records with bodies on both sides of the size
// from which the body is spliced in, and reads each back as it was.
func TestMarshalStep(t *testing.T) {
	big := `{"results":[` + strings.Repeat(`{"host":"<db-1> & co","ok":true},`, 3000) + `null], "total": 3001}`
	for _, tc := range []struct {
		name, body string
		wantErr    bool
	}{
		{"no body", "", false},
		{"small", `{"a": 1}`, false},
		{"big", big, false},
		{"big, not JSON", big[:len(big)-1], true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &store.StepRecord{Key: "fan", Name: "fan", Status: store.StepSucceeded, Attempts: 1,
				FinishedAt: time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC), Split: &store.SplitState{Total: 3001, Next: 3001}}
			if tc.body != "" {
				rec.Body = json.RawMessage(tc.body)
			}
			data, err := store.MarshalStep(rec)
			if tc.wantErr {
				if err == nil {
					t.Fatal("an invalid body was encoded")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got store.StepRecord
			if err := jsonx.Unmarshal(data, &got); err != nil {
				t.Fatalf("reading back %.80s: %v", data, err)
			}
			var wantBody, gotBody any
			_ = json.Unmarshal(rec.Body, &wantBody)
			_ = json.Unmarshal(got.Body, &gotBody)
			if !reflect.DeepEqual(gotBody, wantBody) {
				t.Errorf("body read back differs: %.80s", got.Body)
			}
			got.Body, rec.Body = nil, nil
			if !reflect.DeepEqual(&got, rec) {
				t.Errorf("read back %+v, want %+v", got, *rec)
			}
		})
	}
}

// TestMarshalOrigin encodes origins with payloads on both sides of the
// size from which the payload is spliced in, and reads each back.
func TestMarshalOrigin(t *testing.T) {
	big := `{"hosts": [` + strings.Repeat(`{"name": "<db-1>", "zone": "eu & us"},`, 3000) + `null]}`
	received := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, payload string
		wantErr       bool
	}{
		{"small", `{"a": 1}`, false},
		{"big", big, false},
		{"big, not JSON", big[:len(big)-1], true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &store.Origin{ID: "ev-1", Payload: json.RawMessage(tc.payload), Metadata: json.RawMessage(`{"source":"alertmanager"}`), ReceivedAt: received}
			data, err := store.MarshalOrigin(o)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want one: %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			var got store.Origin
			if err := jsonx.Unmarshal(data, &got); err != nil {
				t.Fatalf("reading back %.80s: %v", data, err)
			}
			var want, have any
			_ = json.Unmarshal(o.Payload, &want)
			_ = json.Unmarshal(got.Payload, &have)
			if !reflect.DeepEqual(have, want) || got.ID != o.ID || string(got.Metadata) != string(o.Metadata) || !got.ReceivedAt.Equal(received) {
				t.Errorf("read back %+v", got)
			}
		})
	}
}
