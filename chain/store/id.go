package store

import (
	"crypto/rand"
	"encoding/binary"
	"strings"
	"sync"
	"time"
)

const crockford = "0123456789abcdefghjkmnpqrstvwxyz"

var idState struct {
	sync.Mutex
	lastMS uint64
	rnd    uint16
	seq    uint64
}

// NewID returns a 26-character id that sorts by creation time: 48 bits of
// milliseconds, then 80 bits that are random at the start of each
// millisecond and count up within it, so ids made by one process are
// strictly ordered and ids from different processes rarely collide.
func NewID() string {
	ms := uint64(time.Now().UnixMilli())
	idState.Lock()
	if ms <= idState.lastMS {
		ms = idState.lastMS
		idState.seq++
	} else {
		var r [10]byte
		_, _ = rand.Read(r[:])
		idState.lastMS = ms
		idState.rnd = binary.BigEndian.Uint16(r[0:2])
		idState.seq = binary.BigEndian.Uint64(r[2:]) >> 1 // room to count up
	}
	hi := ms<<16 | uint64(idState.rnd)
	lo := idState.seq
	idState.Unlock()
	return encodeID(hi, lo)
}

// encodeID writes the 128 bits hi, lo as 26 Crockford base-32 characters.
func encodeID(hi, lo uint64) string {
	var out [26]byte
	for i := 25; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out[:])
}

// IDTime is when NewID made id, to the millisecond; false for a string
// NewID does not make.
func IDTime(id string) (time.Time, bool) {
	if len(id) != 26 {
		return time.Time{}, false
	}
	// The first ten characters hold 50 bits: two zero bits, then the
	// milliseconds.
	var ms uint64
	for i := range 10 {
		v := strings.IndexByte(crockford, id[i])
		if v < 0 {
			return time.Time{}, false
		}
		ms = ms<<5 | uint64(v)
	}
	return time.UnixMilli(int64(ms)), true
}
