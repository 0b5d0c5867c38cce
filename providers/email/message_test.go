package email

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

func TestMessageID(t *testing.T) {
	long := strings.Repeat("split[7]/", 30)
	sum := sha256.Sum256([]byte(long))
	for _, tc := range []struct {
		key, from, want string
	}{
		{"01JD5ZK3Q8N2/notify-all/email-alert", "alerts@example.com", "<01JD5ZK3Q8N2/notify-all/email-alert@example.com>"},
		{"01JD5ZK3Q8N2/fan[3]/mail", "Alerts@Example.COM", "<01JD5ZK3Q8N2/fan%5B3%5D/mail@example.com>"},
		{".a..b.", "a@example.com", "<%2Ea%2E%2Eb%2E@example.com>"},
		{"100% sure=yes é", "a@example.com", "<100%25%20sure%3Dyes%20%C3%A9@example.com>"},
		{long, "a@example.com", "<sha256=" + hex.EncodeToString(sum[:]) + "@example.com>"},
	} {
		if got := messageID(tc.key, tc.from); got != tc.want {
			t.Errorf("messageID(%q, %q) = %q, want %q", tc.key, tc.from, got, tc.want)
		}
	}
	if a, b := messageID(long, "a@example.com"), messageID(long+"x", "a@example.com"); a == b {
		t.Error("two long keys gave one Message-ID")
	}
	if a, b := messageID("", "a@example.com"), messageID("", "a@example.com"); a == b || !strings.HasPrefix(a, "<rand=") {
		t.Errorf("without a dedup key: %q and %q", a, b)
	}
}

func TestWriteField(t *testing.T) {
	for _, tc := range []struct {
		name, value, want string
	}{
		{"Subject", "short", "Subject: short\r\n"},
		{"Subject", "", "Subject: \r\n"},
		{"To", strings.Repeat("<someone@example.com>, ", 4) + "<last@example.com>",
			"To: <someone@example.com>, <someone@example.com>, <someone@example.com>,\r\n <someone@example.com>, <last@example.com>\r\n"},
		{"Message-ID", "<" + strings.Repeat("x", 70) + "@example.com>", "Message-ID:\r\n <" + strings.Repeat("x", 70) + "@example.com>\r\n"},
		// Runs of spaces stay as they are and no line is blank.
		{"Subject", strings.Repeat("a", 70) + "     b", "Subject:\r\n " + strings.Repeat("a", 70) + "    \r\n b\r\n"},
	} {
		var b bytes.Buffer
		writeField(&b, tc.name, tc.value)
		if b.String() != tc.want {
			t.Errorf("writeField(%q, %q) =\n%q, want\n%q", tc.name, tc.value, b.String(), tc.want)
		}
		if unfolded := strings.ReplaceAll(strings.TrimSuffix(b.String(), "\r\n"), "\r\n", ""); unfolded != tc.name+": "+tc.value {
			t.Errorf("unfolded %q, want %q", unfolded, tc.name+": "+tc.value)
		}
	}
}
