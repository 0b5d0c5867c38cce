// Package backup is the file a store's snapshot is written in. It starts
// with a line naming the format and its version, then a header saying
// which kind of store it holds, then the store's own records in frames,
// and ends with a frame that counts what came before and carries its
// checksum: a file cut short or damaged on the way is told from a whole
// one before anything is restored from it.
//
// A frame is a tag byte, the length of its payload as an unsigned varint,
// and the payload. What the data frames hold is each store's own; their
// payloads are often a list of fields (AppendField, Fields).
//
// It is the gateway's own package, with no compatibility promise.
package backup

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/chaingate/gateway/internal/jsonx"
)

// Magic starts every backup file, followed by a space, the format version
// and a newline.
const Magic = "chaingate-backup"

// Version is the version of the format this package writes and reads.
const Version = 1

// Tags of the frames this package writes itself; a store's data frames use
// any other.
const (
	tagHeader = 'H'
	tagEnd    = 'E'
)

// MaxFrame bounds a frame's payload: a store writes its records in frames
// of a few megabytes, and the largest value either store keeps is 512 MB.
// A length past it is damage, not something to allocate.
const MaxFrame = 1 << 30

var (
	// ErrNotBackup is returned for a file that is not a backup at all.
	ErrNotBackup = errors.New("not a chaingate backup file")
	// ErrVersion is returned for a backup in a version of the format this
	// gateway does not read.
	ErrVersion = errors.New("backup format version not readable by this gateway")
	// ErrTruncated is returned for a backup that ends before its end frame,
	// as a copy cut short does.
	ErrTruncated = errors.New("backup file is truncated")
	// ErrDamaged is returned for a backup whose bytes are not those that
	// were written.
	ErrDamaged = errors.New("backup file is damaged")
)

// Header says what a backup holds.
type Header struct {
	// Kind is the kind of store: "bolt" or "redis".
	Kind string `json:"kind"`
	// Format is the store's own layout version, as that kind of store
	// numbers it; a store refuses to restore one it does not read.
	Format string `json:"format"`
	// Created is when the snapshot was taken.
	Created time.Time `json:"created"`
	// Source names what the snapshot was taken from: a file's path, a
	// Redis key prefix.
	Source string `json:"source,omitempty"`
}

// Trailer is what the end frame says besides its checks.
type Trailer struct {
	// Runs is how many runs the backup holds.
	Runs int `json:"runs"`
}

// The end frame's payload is the count of frames before it, of bytes
// before it and of runs (unsigned varints), then the CRC-32C, big-endian,
// of every byte of the file before the checksum itself: a change anywhere,
// the end frame included, shows.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Writer writes a backup: NewWriter writes its first line and header,
// Frame each frame, Close the end frame.
type Writer struct {
	w      io.Writer
	sum    hash.Hash32
	frames int64
	bytes  int64
	closed bool
}

// NewWriter starts a backup on w.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	bw := &Writer{w: w, sum: crc32.New(castagnoli)}
	head, err := jsonx.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encoding the backup header: %w", err)
	}
	if err := bw.write([]byte(Magic + " " + strconv.Itoa(Version) + "\n")); err != nil {
		return nil, err
	}
	if err := bw.Frame(tagHeader, head); err != nil {
		return nil, err
	}
	return bw, nil
}

func (w *Writer) write(b []byte) error {
	n, err := w.w.Write(b)
	w.sum.Write(b[:n])
	w.bytes += int64(n)
	if err != nil {
		return fmt.Errorf("writing the backup: %w", err)
	}
	return nil
}

// Frame writes one frame.
func (w *Writer) Frame(tag byte, payload []byte) error {
	if w.closed {
		return errors.New("writing the backup: it is closed")
	}
	if len(payload) > MaxFrame {
		return fmt.Errorf("writing the backup: a frame of %d bytes is larger than %d", len(payload), MaxFrame)
	}
	head := binary.AppendUvarint([]byte{tag}, uint64(len(payload)))
	if err := w.write(head); err != nil {
		return err
	}
	if err := w.write(payload); err != nil {
		return err
	}
	w.frames++
	return nil
}

// chunk is the size of the frames Chunks writes.
const chunk = 1 << 20

// Chunks returns a writer that writes what it is given in frames of the
// tag, a megabyte each (a store's file copied as it is); Flush writes the
// last one.
func (w *Writer) Chunks(tag byte) *bufio.Writer {
	return bufio.NewWriterSize(chunkWriter{w: w, tag: tag}, chunk)
}

type chunkWriter struct {
	w   *Writer
	tag byte
}

func (c chunkWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += chunk {
		if err := c.w.Frame(c.tag, p[off:min(off+chunk, len(p))]); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

// Close writes the end frame. It does not close the underlying writer.
func (w *Writer) Close(t Trailer) error {
	if w.closed {
		return nil
	}
	var payload []byte
	payload = binary.AppendUvarint(payload, uint64(w.frames))
	payload = binary.AppendUvarint(payload, uint64(w.bytes))
	payload = binary.AppendUvarint(payload, uint64(max(t.Runs, 0)))
	head := binary.AppendUvarint([]byte{tagEnd}, uint64(len(payload)+4))
	w.sum.Write(head)
	w.sum.Write(payload)
	payload = binary.BigEndian.AppendUint32(payload, w.sum.Sum32())
	if _, err := w.w.Write(append(head, payload...)); err != nil {
		return fmt.Errorf("writing the backup: %w", err)
	}
	w.closed = true
	return nil
}

// Reader reads a backup frame by frame, checking it as it goes; only once
// Next has returned io.EOF is the backup known to be whole.
type Reader struct {
	r *bufio.Reader
	// in counts what was read of the file, which is all of it once the
	// file is found to end early.
	in     *countingReader
	header Header
	sum    hash.Hash32
	frames int64
	bytes  int64
	buf    []byte
	// trailer is the end frame's, once read.
	trailer *Trailer
}

// NewReader reads a backup's first line and header.
func NewReader(r io.Reader) (*Reader, error) {
	in := &countingReader{r: r}
	br := &Reader{r: bufio.NewReaderSize(in, 64<<10), in: in, sum: crc32.New(castagnoli)}
	line, err := br.r.ReadSlice('\n')
	text, want := strings.TrimSuffix(string(line), "\n"), Magic+" "
	if !strings.HasPrefix(text, want) {
		if err != nil && strings.HasPrefix(want, text) {
			return nil, fmt.Errorf("reading the backup: %w: it ends after %d bytes, in its first line", ErrTruncated, len(line))
		}
		return nil, fmt.Errorf("reading the backup: %w (it does not start with %q)", ErrNotBackup, want)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the backup: %w: its first line does not end", ErrTruncated)
	}
	v, err := strconv.Atoi(text[len(want):])
	switch {
	case err != nil || v < 1:
		return nil, fmt.Errorf("reading the backup: %w (its first line names no version: %.40q)", ErrNotBackup, text)
	case v > Version:
		return nil, fmt.Errorf("reading the backup: %w: it is in version %d of the backup format, and this gateway reads version %d; restore it with the gateway version that took it, or a later one", ErrVersion, v, Version)
	}
	br.count(line)
	tag, payload, err := br.frame()
	if err != nil {
		return nil, err
	}
	if tag != tagHeader {
		return nil, fmt.Errorf("reading the backup: %w: its first frame is not its header", ErrDamaged)
	}
	if err := json.Unmarshal(payload, &br.header); err != nil {
		return nil, fmt.Errorf("reading the backup: %w: decoding its header: %w", ErrDamaged, err)
	}
	if br.header.Kind == "" {
		return nil, fmt.Errorf("reading the backup: %w: its header names no kind of store", ErrDamaged)
	}
	return br, nil
}

// Header returns what the backup says it holds.
func (r *Reader) Header() Header { return r.header }

// Trailer returns what the end frame says; valid once Next has returned
// io.EOF.
func (r *Reader) Trailer() Trailer {
	if r.trailer == nil {
		return Trailer{}
	}
	return *r.trailer
}

func (r *Reader) count(b []byte) {
	r.sum.Write(b)
	r.bytes += int64(len(b))
}

// frame reads one frame and counts it into the checksum; the payload is
// valid until the next call.
func (r *Reader) frame() (byte, []byte, error) {
	tag, err := r.r.ReadByte()
	if errors.Is(err, io.EOF) {
		where := fmt.Sprintf("after frame %d", r.frames)
		if r.frames == 1 {
			where += ", its header"
		}
		return 0, nil, r.truncated(where)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("reading the backup: %w", err)
	}
	n, err := binary.ReadUvarint(r.r)
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return 0, nil, r.truncated(fmt.Sprintf("in the length of frame %d", r.frames+1))
	case err != nil:
		return 0, nil, fmt.Errorf("reading the backup: %w: frame %d: %w", ErrDamaged, r.frames+1, err)
	case n > MaxFrame:
		return 0, nil, fmt.Errorf("reading the backup: %w: frame %d claims %d bytes", ErrDamaged, r.frames+1, n)
	}
	if uint64(cap(r.buf)) < n {
		r.buf = make([]byte, n)
	}
	payload := r.buf[:n]
	if got, err := io.ReadFull(r.r, payload); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, nil, r.truncated(fmt.Sprintf("%d bytes into frame %d, which holds %d", got, r.frames+1, n))
		}
		return 0, nil, fmt.Errorf("reading the backup: %w", err)
	}
	if tag != tagEnd {
		r.count(binary.AppendUvarint([]byte{tag}, n))
		r.count(payload)
		r.frames++
	}
	return tag, payload, nil
}

// truncated says where a backup cut short ends: the file's length, and
// where that falls among its frames.
func (r *Reader) truncated(where string) error {
	return fmt.Errorf("reading the backup: %w: it ends after %d bytes, %s, without its end frame (was the copy cut short?)", ErrTruncated, r.in.n, where)
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// Next returns the next data frame; its payload is valid until the next
// call. After the last one it checks the end frame, and that nothing comes
// after it, and returns io.EOF.
func (r *Reader) Next() (byte, []byte, error) {
	if r.trailer != nil {
		return 0, nil, io.EOF
	}
	tag, payload, err := r.frame()
	if err != nil {
		return 0, nil, err
	}
	switch tag {
	case tagHeader:
		return 0, nil, fmt.Errorf("reading the backup: %w: a second header at frame %d", ErrDamaged, r.frames)
	case tagEnd:
		t, err := r.end(payload)
		if err != nil {
			return 0, nil, err
		}
		if _, err := r.r.ReadByte(); !errors.Is(err, io.EOF) {
			return 0, nil, fmt.Errorf("reading the backup: %w: something follows its end frame", ErrDamaged)
		}
		r.trailer = &t
		return 0, nil, io.EOF
	}
	return tag, payload, nil
}

// end checks the end frame's payload against what was read.
func (r *Reader) end(payload []byte) (Trailer, error) {
	var counts [3]uint64
	rest := payload
	for i := range counts {
		n, k := binary.Uvarint(rest)
		if k <= 0 {
			return Trailer{}, fmt.Errorf("reading the backup: %w: its end frame cannot be decoded", ErrDamaged)
		}
		counts[i], rest = n, rest[k:]
	}
	if len(rest) != 4 {
		return Trailer{}, fmt.Errorf("reading the backup: %w: its end frame cannot be decoded", ErrDamaged)
	}
	r.sum.Write(binary.AppendUvarint([]byte{tagEnd}, uint64(len(payload))))
	r.sum.Write(payload[:len(payload)-4])
	sum := binary.BigEndian.Uint32(rest)
	if counts[0] != uint64(r.frames) || counts[1] != uint64(r.bytes) || sum != r.sum.Sum32() {
		return Trailer{}, fmt.Errorf("reading the backup: %w: its end frame counts %d frames and %d bytes with checksum %08x, the file has %d frames and %d bytes with checksum %08x",
			ErrDamaged, counts[0], counts[1], sum, r.frames, r.bytes, r.sum.Sum32())
	}
	return Trailer{Runs: int(min(counts[2], math.MaxInt32))}, nil
}

// Check reads a whole backup, and returns its header and trailer if it is
// whole and undamaged.
func Check(r io.Reader) (Header, Trailer, error) {
	br, err := NewReader(r)
	if err != nil {
		return Header{}, Trailer{}, err
	}
	for {
		if _, _, err := br.Next(); errors.Is(err, io.EOF) {
			return br.Header(), br.Trailer(), nil
		} else if err != nil {
			return br.Header(), Trailer{}, err
		}
	}
}

// AppendField appends a field, its length first, to a frame's payload.
func AppendField(p, field []byte) []byte {
	p = binary.AppendUvarint(p, uint64(len(field)))
	return append(p, field...)
}

// AppendString is AppendField for a string.
func AppendString(p []byte, field string) []byte {
	p = binary.AppendUvarint(p, uint64(len(field)))
	return append(p, field...)
}

// Fields splits a payload AppendField wrote into its fields, which share
// the payload's memory.
func Fields(p []byte) ([][]byte, error) {
	var out [][]byte
	for len(p) > 0 {
		n, k := binary.Uvarint(p)
		if k <= 0 || n > uint64(len(p)-k) {
			return nil, fmt.Errorf("%w: field %d of a frame runs past its end", ErrDamaged, len(out)+1)
		}
		out = append(out, p[k:k+int(n)])
		p = p[k+int(n):]
	}
	return out, nil
}
