package backup_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/chaingate/gateway/chain/store/backup"
)

type frame struct {
	tag     byte
	payload []byte
}

// sample writes a backup of a few frames, and data of size n in chunks.
func sample(t testing.TB, n int) ([]byte, []frame) {
	t.Helper()
	var buf bytes.Buffer
	w, err := backup.NewWriter(&buf, backup.Header{Kind: "test", Format: "7", Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Source: "a place"})
	if err != nil {
		t.Fatal(err)
	}
	frames := []frame{{'K', []byte("one")}, {'K', nil}, {'A', bytes.Repeat([]byte{0, 1, 2}, 1000)}}
	for _, f := range frames {
		if err := w.Frame(f.tag, f.payload); err != nil {
			t.Fatal(err)
		}
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), n/16)
	cw := w.Chunks('D')
	if _, err := cw.Write(big[:len(big)/3]); err != nil {
		t.Fatal(err)
	}
	if _, err := cw.Write(big[len(big)/3:]); err != nil {
		t.Fatal(err)
	}
	if err := cw.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(backup.Trailer{Runs: 42}); err != nil {
		t.Fatal(err)
	}
	var chunks []byte
	for off := 0; off < len(big); off += 1 << 20 {
		frames = append(frames, frame{'D', big[off:min(off+1<<20, len(big))]})
		chunks = append(chunks, big[off:min(off+1<<20, len(big))]...)
	}
	if !bytes.Equal(chunks, big) {
		t.Fatal("the expected chunks do not make up the data")
	}
	return buf.Bytes(), frames
}

func readAll(data []byte) (backup.Header, []frame, backup.Trailer, error) {
	r, err := backup.NewReader(bytes.NewReader(data))
	if err != nil {
		return backup.Header{}, nil, backup.Trailer{}, err
	}
	var out []frame
	for {
		tag, p, err := r.Next()
		if errors.Is(err, io.EOF) {
			return r.Header(), out, r.Trailer(), nil
		}
		if err != nil {
			return r.Header(), out, backup.Trailer{}, err
		}
		out = append(out, frame{tag, append([]byte(nil), p...)})
	}
}

func TestRoundTrip(t *testing.T) {
	data, want := sample(t, 2400_000) // three chunks
	h, got, tr, err := readAll(data)
	if err != nil {
		t.Fatal(err)
	}
	if h.Kind != "test" || h.Format != "7" || h.Source != "a place" || !h.Created.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("header %+v", h)
	}
	if tr.Runs != 42 {
		t.Errorf("trailer %+v", tr)
	}
	if len(got) != len(want) {
		t.Fatalf("%d frames, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].tag != want[i].tag || !bytes.Equal(got[i].payload, want[i].payload) {
			t.Errorf("frame %d: tag %c, %d bytes; want %c, %d bytes", i, got[i].tag, len(got[i].payload), want[i].tag, len(want[i].payload))
		}
	}
}

// TestCutShort cuts a backup at every length short of whole: each is
// refused as truncated, none read as a backup with less in it.
func TestCutShort(t *testing.T) {
	data, _ := sample(t, 4000)
	for n := range len(data) {
		_, _, _, err := readAll(data[:n])
		if !errors.Is(err, backup.ErrTruncated) {
			t.Fatalf("cut at %d of %d bytes: %v", n, len(data), err)
		}
	}
}

// TestDamage changes one byte at a time: every change is refused.
func TestDamage(t *testing.T) {
	data, _ := sample(t, 4000)
	for i := range len(data) {
		bad := bytes.Clone(data)
		bad[i] ^= 0x20
		_, _, _, err := readAll(bad)
		if !errors.Is(err, backup.ErrDamaged) && !errors.Is(err, backup.ErrTruncated) && !errors.Is(err, backup.ErrNotBackup) && !errors.Is(err, backup.ErrVersion) {
			t.Fatalf("byte %d of %d changed: %v", i, len(data), err)
		}
	}
}

func TestRefusals(t *testing.T) {
	data, _ := sample(t, 100)
	tests := []struct {
		name string
		data []byte
		want error
		says string
	}{
		{"empty", nil, backup.ErrTruncated, "ends after 0 bytes"},
		{"another file", []byte("SQLite format 3\x00\x10\x00"), backup.ErrNotBackup, "does not start with"},
		{"no version", []byte("chaingate-backup x\n"), backup.ErrNotBackup, "names no version"},
		{"a later version", append([]byte("chaingate-backup 2\n"), data[len("chaingate-backup 1\n"):]...), backup.ErrVersion, "version 2 of the backup format, and this gateway reads version 1"},
		{"something after the end", append(bytes.Clone(data), 0), backup.ErrDamaged, "follows its end frame"},
		{"no header", []byte("chaingate-backup 1\nK\x00"), backup.ErrDamaged, "first frame is not its header"},
		{"a huge frame", []byte("chaingate-backup 1\nH\xff\xff\xff\xff\x0f"), backup.ErrDamaged, "claims"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := readAll(tc.data)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v; want %v saying %q", err, tc.want, tc.says)
			}
		})
	}
}

// TestCutShortSaysWhere: a backup cut short is reported with the length
// it has, and where among its frames that falls.
func TestCutShortSaysWhere(t *testing.T) {
	data, _ := sample(t, 2400_000)
	var head bytes.Buffer
	if _, err := backup.NewWriter(&head, backup.Header{Kind: "test", Format: "7", Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Source: "a place"}); err != nil {
		t.Fatal(err)
	}
	// The first chunk's payload, in frame 5, starts after the header, two
	// small frames, one of 3000 bytes, and its own tag and length.
	firstChunk := head.Len() + (1 + 1 + 3) + (1 + 1) + (1 + 2 + 3000) + (1 + 3)
	tests := []struct {
		name string
		cut  int
		says string
	}{
		{"in the first line", 10, "it ends after 10 bytes, in its first line"},
		{"after the header", head.Len(), fmt.Sprintf("it ends after %d bytes, after frame 1, its header, without its end frame", head.Len())},
		{"in a frame's length", head.Len() + 1, fmt.Sprintf("it ends after %d bytes, in the length of frame 2", head.Len()+1)},
		{"half way through", 501 << 10, fmt.Sprintf("it ends after 513024 bytes, %d bytes into frame 5, which holds 1048576, without its end frame", 513024-firstChunk)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := readAll(data[:tc.cut])
			if !errors.Is(err, backup.ErrTruncated) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v; want it to say %q", err, tc.says)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	data, _ := sample(t, 100)
	h, tr, err := backup.Check(bytes.NewReader(data))
	if err != nil || h.Kind != "test" || tr.Runs != 42 {
		t.Fatalf("%+v %+v %v", h, tr, err)
	}
	if _, _, err := backup.Check(bytes.NewReader(data[:len(data)-1])); !errors.Is(err, backup.ErrTruncated) {
		t.Fatalf("a file short of its last byte: %v", err)
	}
}

func TestFields(t *testing.T) {
	tests := [][]string{nil, {""}, {"a", "", strings.Repeat("x", 300)}}
	for _, fields := range tests {
		var p []byte
		for _, f := range fields {
			p = backup.AppendString(p, f)
		}
		got, err := backup.Fields(p)
		if err != nil || len(got) != len(fields) {
			t.Fatalf("%q: %q %v", fields, got, err)
		}
		for i := range fields {
			if string(got[i]) != fields[i] {
				t.Errorf("%q: field %d is %q", fields, i, got[i])
			}
		}
	}
	if _, err := backup.Fields([]byte{5, 'a'}); !errors.Is(err, backup.ErrDamaged) {
		t.Errorf("a field past the end: %v", err)
	}
}

// FuzzReader feeds the reader damaged and made-up backups: it refuses them
// with an error, never panics.
func FuzzReader(f *testing.F) {
	data, _ := sample(f, 100)
	f.Add(data[:200])
	f.Add([]byte("chaingate-backup 1\nH\x02{}E\x02{}"))
	f.Add([]byte("chaingate-backup 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, frames, _, err := readAll(data)
		if err == nil && len(frames) > len(data) {
			t.Fatalf("%d frames from %d bytes", len(frames), len(data))
		}
		for _, fr := range frames {
			_, _ = backup.Fields(fr.payload)
		}
	})
}
