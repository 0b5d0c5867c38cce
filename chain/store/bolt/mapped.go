package bolt

import bbolt "go.etcd.io/bbolt"

// releaseEvery is how many bytes a scan, or the writer, goes through in the
// file mapping between hand-backs of its pages.
const (
	releaseEvery      = 8 << 20
	releaseEveryWrite = 64 << 20
)

// A bbolt store is read through a shared mapping of its file, and every
// page a read or a commit touches stays counted in the process's resident
// memory until the mapping is dropped: joining a million-item split reads
// its slot records once, and would keep the whole file resident, as would
// the commits that wrote them. Long reads and the writer hand the mapping's
// pages back as they go. The pages stay in the kernel's page cache, so a
// later read only maps them again.

// mappedRead counts what a read transaction went through in the mapping.
type mappedRead struct {
	tx      *bbolt.Tx
	passed  int
	release bool
}

// note records that n more bytes of the mapping were read and copied out,
// and hands the mapping back each time the count passes releaseEvery.
func (m *mappedRead) note(n int) {
	if m.passed += n; m.passed >= releaseEvery {
		releaseMapping(m.tx)
		m.passed, m.release = 0, true
	}
}

// copyOut copies a large value out of the mapping a piece at a time,
// handing the pieces back as it goes.
func (m *mappedRead) copyOut(v []byte) []byte {
	out := make([]byte, len(v))
	for off := 0; off < len(v); off += releaseEvery {
		n := copy(out[off:], v[off:min(off+releaseEvery, len(v))])
		m.note(n)
	}
	return out
}

// done hands back the rest of a long read's pages; a short read keeps them,
// as most pages it went through are the branches every read goes through.
func (m *mappedRead) done() {
	if m.release && m.passed > 0 {
		releaseMapping(m.tx)
	}
}
