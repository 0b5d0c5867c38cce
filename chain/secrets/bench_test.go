package secrets_test

import (
	"encoding/base64"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/secrets"
)

// benchBodies are step bodies as the engine redacts them before each
// commit: a typical answer, one with JSON escapes (an API that writes
// \u003c and \/), a large one, and one carrying a file as base64, whose
// letters and digits are what encoded secrets are made of.
var benchBodies = map[string][]byte{
	"1KiB":          []byte(`{"ok":true,"channel":"C0123456789","ts":"1700000000.000100","message":{"text":"` + strings.Repeat("disk full on db-1 ", 50) + `"}}`),
	"1KiB-escaped":  []byte(`{"ok":true,"url":"https:\/\/status.example.com\/incidents\/1","message":{"text":"` + strings.Repeat("\u003cb\u003edisk\u003c/b\u003e full ", 40) + `"}}`),
	"100KiB":        []byte(`{"hosts":[` + strings.Repeat(`{"name":"host-0000001","status":"up","zone":"eu-west-1a"},`, 1700) + `{}]}`),
	"100KiB-secret": []byte(`{"hosts":[` + strings.Repeat(`{"name":"host-0000001","status":"up","zone":"eu-west-1a"},`, 1700) + `{"token":"Bearer xoxb-1234-5678-abcdef"}]}`),
	"100KiB-base64": []byte(`{"name":"report.pdf","content":"` + base64.StdEncoding.EncodeToString(pseudoRandom(75<<10)) + `"}`),
}

func BenchmarkRedact(b *testing.B) {
	red := secrets.NewRedactor(map[string]string{"SLACK": "xoxb-1234-5678-abcdef", "PD": "R0UT1NGK3Y0123456789abcdef012345", "SMTP": "hunter2-but-longer"})
	for name, body := range benchBodies {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				_ = red.JSON(body)
			}
		})
	}
}

// pseudoRandom is n bytes that are the same in every run.
func pseudoRandom(n int) []byte {
	rng := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}
