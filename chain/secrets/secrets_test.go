package secrets_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/chaingate/gateway/chain/secrets"
	"github.com/chaingate/gateway/templates"
)

func TestLoad(t *testing.T) {
	long := strings.Repeat("k", 100<<10)
	tests := []struct {
		name    string
		env     map[string]string
		file    string // "" for no file
		want    map[string]string
		wantErr string // substring; path stands for the file's path
	}{
		{
			name: "environment only",
			env:  map[string]string{"CHAINGATE_SECRET_PD_KEY": "env-value", "UNRELATED": "x"},
			want: map[string]string{"PD_KEY": "env-value"},
		},
		{
			name: "file with comments, blanks and spaces",
			file: "# a comment\n\nTOKEN = abc=def \n  OTHER=v\r\n",
			want: map[string]string{"TOKEN": "abc=def", "OTHER": "v"},
		},
		{
			name: "file wins over the environment",
			env:  map[string]string{"CHAINGATE_SECRET_TOKEN": "from-env", "CHAINGATE_SECRET_ONLY_ENV": "e"},
			file: "TOKEN=from-file\n",
			want: map[string]string{"TOKEN": "from-file", "ONLY_ENV": "e"},
		},
		{
			name: "a line longer than a scanner's buffer keeps later secrets",
			file: "CERT=" + long + "\nAFTER=still-read\n",
			want: map[string]string{"CERT": long, "AFTER": "still-read"},
		},
		{
			name:    "line without a name",
			file:    "A=1\n=value\n",
			wantErr: "path:2: want NAME=VALUE",
		},
		{
			name:    "line without =",
			file:    "A=1\n\n# c\njust text\n",
			wantErr: "path:4: want NAME=VALUE",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, kv := range os.Environ() {
				if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, secrets.EnvPrefix) {
					t.Setenv(k, "")
					os.Unsetenv(k)
				}
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			path := ""
			if tc.file != "" {
				path = filepath.Join(t.TempDir(), "secrets.env")
				if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := secrets.Load(path)
			if tc.wantErr != "" {
				want := strings.ReplaceAll(tc.wantErr, "path", path)
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("error %v, want one containing %q", err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", abbreviate(got), abbreviate(tc.want))
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := secrets.Load(filepath.Join(t.TempDir(), "nope.env"))
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "reading secrets file") {
		t.Errorf("error %v", err)
	}
}

func abbreviate(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if len(v) > 20 {
			v = v[:20] + "…"
		}
		out[k] = v
	}
	return out
}

// jsonText is how templates write s inside a JSON document.
func jsonText(t *testing.T, s string) string {
	t.Helper()
	tpl, err := templates.CompileString("<<secrets.X>>")
	if err != nil {
		t.Fatal(err)
	}
	b, err := tpl.AppendJSON(nil, templates.MapScope{"secrets": map[string]any{"X": s}})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func marshal(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func TestRedactor(t *testing.T) {
	r := secrets.NewRedactor(map[string]string{
		"PLAIN":  "hunter22",
		"QUOTED": `p&ss"word`,
		"HTML":   "<tag>&amp",
		"LINES":  "line1\nline2",
		"SHORT":  "abc",
		"LONGER": "hunter22-extended",
	})
	tests := []struct {
		name, in, want string
	}{
		{"plain", "token=hunter22 end", "token=[REDACTED] end"},
		{"longer secret whole", "x hunter22-extended y", "x [REDACTED] y"},
		{"short values stay", "abc abcd", "abc abcd"},
		{"as templates write JSON", `{"p":` + jsonText(t, `p&ss"word`) + `}`, `{"p":"[REDACTED]"}`},
		{"as json.Marshal writes it", `{"p":` + marshal(`p&ss"word`) + `}`, `{"p":"[REDACTED]"}`},
		{"html chars, templates", jsonText(t, "<tag>&amp"), `"[REDACTED]"`},
		{"html chars, json.Marshal", marshal("<tag>&amp"), `"[REDACTED]"`},
		{"newline escaped", jsonText(t, "line1\nline2"), `"[REDACTED]"`},
		{"newline raw", "got line1\nline2", "got [REDACTED]"},
		{"nothing to redact", "all clear", "all clear"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := r.String(tc.in); got != tc.want {
				t.Errorf("String(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if got := string(r.JSON([]byte(tc.in))); got != tc.want {
				t.Errorf("JSON(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestRedactorLeavesCleanBytesAlone(t *testing.T) {
	r := secrets.NewRedactor(map[string]string{"A": "secret-value"})
	in := []byte("nothing here")
	if out := r.JSON(in); &out[0] != &in[0] {
		t.Error("JSON copied input that held no secret")
	}
	for _, r := range []*secrets.Redactor{nil, secrets.NewRedactor(nil), secrets.NewRedactor(map[string]string{"S": "ab"})} {
		if r.Active() || r.String("ab secret-value") != "ab secret-value" {
			t.Errorf("redactor %v redacts", r)
		}
	}
}

func TestHandlerRedacts(t *testing.T) {
	r := secrets.NewRedactor(map[string]string{"A": "secret-value"})
	var buf bytes.Buffer
	log := slog.New(r.Handler(slog.NewJSONHandler(&buf, nil))).With("pre", "secret-value")
	log.Info("saw secret-value", "s", "secret-value", slog.Group("g", "in", "secret-value"), "any", []string{"secret-value"})
	if out := buf.String(); strings.Contains(out, "secret-value") || strings.Count(out, secrets.Placeholder) != 5 {
		t.Errorf("log line: %s", out)
	}
}

// TestRedactWhateverTheEncoding: a value is redacted however it is written:
// as it is, JSON-escaped in any way, percent-encoded in any way.
func TestRedactWhateverTheEncoding(t *testing.T) {
	const secret = "ab-cd/ef<g> h|i"
	red := secrets.NewRedactor(map[string]string{"S": secret})
	texts := []string{
		secret,
		`ab\u002dcd\/ef\u003cg\u003e h|i`,
		`ab\u002Dcd/ef<g>\u0020h\u007ci`,
		"https://hooks.example.com/x/ab-cd%2Fef%3Cg%3E%20h%7Ci?y=1",
		"https://hooks.example.com/x/ab-cd/ef%3cg%3e%20h%7ci",
		"token=ab-cd%2Fef%3Cg%3E+h%7Ci",
		`Post "https://h/ab%2Dcd%2fef%3Cg%3E%20h%7Ci": dial tcp: refused`,
	}
	for _, s := range texts {
		got := red.String(s)
		if !strings.Contains(got, "[REDACTED]") || strings.Contains(got, "cd/ef") || strings.Contains(got, "ef<g") {
			t.Errorf("String(%q) = %q", s, got)
		}
	}
	docs := []string{
		`{"t": "ab\u002dcd\/ef\u003cg\u003e h|i"}`,
		`{"list": [1, {"deep": "x ab-cd\/ef<g> h\u007ci y"}], "n": 12345678901234567890}`,
		`{"ab\u002dcd/ef<g> h|i": true}`,
		`{"url": "https://h/ab-cd%2Fef%3Cg%3E%20h%7Ci"}`,
	}
	for _, d := range docs {
		got := red.JSON([]byte(d))
		var v any
		if err := json.Unmarshal(got, &v); err != nil {
			t.Errorf("JSON(%s) = %s, not JSON: %v", d, got, err)
			continue
		}
		decoded, _ := json.Marshal(v)
		if !strings.Contains(string(got), "[REDACTED]") || strings.Contains(string(decoded), "cd/ef") {
			t.Errorf("JSON(%s) = %s", d, got)
		}
		if strings.Contains(d, "12345678901234567890") && !strings.Contains(string(got), "12345678901234567890") {
			t.Errorf("a large number lost digits: %s", got)
		}
	}
	// What holds no secret comes back as it was, the same bytes.
	for _, d := range []string{`{"a": "x\u002dy", "b": "100%"}`, `{"plain": true}`, `not json \u0041 50%`} {
		in := []byte(d)
		if got := red.JSON(in); &got[0] != &in[0] {
			t.Errorf("JSON(%s) made a copy: %s", d, got)
		}
	}
	if got := red.String(`50% off \u00e9t\u00e9`); got != `50% off \u00e9t\u00e9` {
		t.Errorf("text without a secret changed: %q", got)
	}
}

// encodings are the ways a provider may hand a value back besides as it
// is: each turns bytes into text, and reads a text back into every
// candidate for what it may hold, at every alignment.
var encodings = []struct {
	name   string
	encode func([]byte) string
	decode func(string) [][]byte
}{
	{"base64 standard, padded", base64.StdEncoding.EncodeToString, decodeBase64},
	{"base64 standard, raw", base64.RawStdEncoding.EncodeToString, decodeBase64},
	{"base64 URL, padded", base64.URLEncoding.EncodeToString, decodeBase64},
	{"base64 URL, raw", base64.RawURLEncoding.EncodeToString, decodeBase64},
	{"hex, lower case", hex.EncodeToString, decodeHex},
	{"hex, upper case", func(b []byte) string { return strings.ToUpper(hex.EncodeToString(b)) }, decodeHex},
	{"URL query", func(b []byte) string { return url.QueryEscape(string(b)) }, decodeURL},
	{"URL path", func(b []byte) string { return url.PathEscape(string(b)) }, decodeURL},
	{"URL, every byte, lower case", func(b []byte) string {
		var s strings.Builder
		for _, c := range b {
			fmt.Fprintf(&s, "%%%02x", c)
		}
		return s.String()
	}, decodeURL},
	{"JSON string", func(b []byte) string { return strings.Trim(marshal(string(b)), `"`) }, decodeJSON},
	{"JSON, every character \\u-escaped", func(b []byte) string {
		var s strings.Builder
		for _, r := range string(b) {
			fmt.Fprintf(&s, `\u%04X`, r)
		}
		return s.String()
	}, decodeJSON},
}

// runs are the longest stretches of s made of the bytes in set.
func runs(s, set string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return !strings.ContainsRune(set, r) })
}

func decodeBase64(s string) [][]byte {
	var out [][]byte
	for _, run := range runs(strings.NewReplacer("-", "+", "_", "/").Replace(s), "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") {
		for skip := 0; skip < 4 && skip < len(run); skip++ {
			r := run[skip:]
			if len(r)%4 == 1 {
				r = r[:len(r)-1]
			}
			if b, err := base64.RawStdEncoding.DecodeString(r); err == nil {
				out = append(out, b)
			}
		}
	}
	return out
}

func decodeHex(s string) [][]byte {
	var out [][]byte
	for _, run := range runs(strings.ToLower(s), "0123456789abcdef") {
		for skip := 0; skip < 2 && skip < len(run); skip++ {
			r := run[skip:]
			b, _ := hex.DecodeString(r[:len(r)/2*2])
			out = append(out, b)
		}
	}
	return out
}

func decodeURL(s string) [][]byte {
	u, err := url.QueryUnescape(s)
	if err != nil {
		return [][]byte{[]byte(s)}
	}
	return [][]byte{[]byte(u), []byte(strings.ReplaceAll(u, "+", " "))}
}

func decodeJSON(s string) [][]byte {
	var v struct{ Data string }
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return [][]byte{[]byte(s)}
	}
	return [][]byte{[]byte(v.Data)}
}

// TestRedactEncodings writes values of each length modulo three, after
// prefixes of each length modulo three (as in a Basic credential, where
// "user:" comes first), in every encoding, inside a JSON document; the
// document read back must hold nothing from which four bytes of the value
// in a row can be decoded, at any alignment, and must still be JSON.
func TestRedactEncodings(t *testing.T) {
	vals := []string{"k3y/+?&= x", "xoxb-1234-5678", "R0UT1NGK3Y0123456789abcdef012345", "pässwörd €5"}
	red := secrets.NewRedactor(map[string]string{"A": vals[0], "B": vals[1], "C": vals[2], "D": vals[3]})
	for _, enc := range encodings {
		t.Run(enc.name, func(t *testing.T) {
			for _, v := range vals {
				for _, pre := range []string{"", "u", "us", "user:", "Bearer "} {
					text := enc.encode([]byte(pre + v + "\n-trailer"))
					doc := `{"data":"` + text + `","n":1}`
					got := string(red.JSON([]byte(doc)))
					if !strings.Contains(got, secrets.Placeholder) {
						t.Errorf("%q after %q: not redacted: %s", v, pre, got)
						continue
					}
					if !json.Valid([]byte(got)) {
						t.Errorf("%q after %q: no longer JSON: %s", v, pre, got)
					}
					for _, b := range enc.decode(got) {
						for i := 0; i+4 <= len(v); i++ {
							if bytes.Contains(b, []byte(v[i:i+4])) {
								t.Errorf("%q after %q: %q can be read from %s", v, pre, v[i:i+4], got)
							}
						}
					}
				}
			}
		})
	}
}

// TestRedactLeavesEncodedDataAlone: encoded data holding no secret, the
// letters and digits encoded values are made of, comes back as it was.
func TestRedactLeavesEncodedDataAlone(t *testing.T) {
	red := secrets.NewRedactor(map[string]string{"A": "xoxb-1234-5678", "B": "hunter22", "C": "R0UT1NGK3Y0123456789abcdef012345"})
	rng := rand.New(rand.NewPCG(3, 4))
	data := make([]byte, 1<<16)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	for _, enc := range encodings {
		doc := []byte(`{"data":"` + enc.encode(data) + `"}`)
		if got := red.JSON(doc); &got[0] != &doc[0] {
			t.Errorf("%s: data holding no secret was changed", enc.name)
		}
	}
}

// TestRedactPlacesDecodedValues: a value found only once the text is
// decoded is replaced where it is written, escapes and all, and the rest
// of the text keeps its escapes.
func TestRedactPlacesDecodedValues(t *testing.T) {
	red := secrets.NewRedactor(map[string]string{"S": "ab-cd/ef"})
	tests := []struct{ in, want string }{
		{`{"a":"x\u002f","b":"ab\u002dcd\/ef","c":"y\u002f"}`, `{"a":"x\u002f","b":"[REDACTED]","c":"y\u002f"}`},
		{`50% of ab%2Dcd%2fef, 100%`, `50% of [REDACTED], 100%`},
		{`\u0061b-cd/e\u0066 and ab-cd/ef`, `[REDACTED] and [REDACTED]`},
		{`ab-cd\/ef%`, `[REDACTED]%`},
		{`\ud83d\ude00ab-cd/ef\ud83d\ude00`, `\ud83d\ude00[REDACTED]\ud83d\ude00`},
	}
	for _, tc := range tests {
		if got := red.String(tc.in); got != tc.want {
			t.Errorf("String(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// FuzzRedact: whatever the text and the value, redaction does not panic,
// leaves no plain occurrence of the value, and hands back text that held
// none unchanged.
func FuzzRedact(f *testing.F) {
	f.Add("token=hunter22", "hunter22")
	f.Add(`{"a":"\u0068unter22%"}`, "hunter22")
	f.Add(`aHVudGVyMjI= \ud83d %4`, "hunter22")
	f.Add(`\u12`, "ab\\u12")
	f.Fuzz(func(t *testing.T, text, v string) {
		if len(v) < 4 || strings.ContainsAny(v, "[]") {
			return
		}
		red := secrets.NewRedactor(map[string]string{"V": v})
		got := red.String(text)
		if strings.Contains(got, v) {
			t.Errorf("String(%q) = %q, still holds %q", text, got, v)
		}
		if !strings.Contains(got, secrets.Placeholder) && got != text {
			t.Errorf("String(%q) = %q, changed without redacting", text, got)
		}
		if b := red.JSON([]byte(text)); string(b) != got {
			t.Errorf("JSON(%q) = %q, String gave %q", text, b, got)
		}
	})
}
