package bolt

import (
	"strconv"

	bbolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// initialMmapSize maps a gigabyte of address space from the start, which
// costs no memory: bbolt remaps when the file outgrows its mapping, copying
// every value the committing transaction holds to the heap and waiting for
// every reader, a long scan included. A 32-bit process has no gigabyte of
// address space to spare.
func initialMmapSize() int {
	if strconv.IntSize < 64 {
		return 0
	}
	return 1 << 30
}

// releaseMapping drops the pages of the store's mapping from the process.
// For a shared file mapping MADV_DONTNEED loses nothing: the next access
// reads the page cache again. tx keeps the mapping in place meanwhile.
func releaseMapping(tx *bbolt.Tx) {
	info := tx.DB().Info()
	_, _, _ = unix.Syscall(unix.SYS_MADVISE, info.Data, uintptr(tx.Size()), unix.MADV_DONTNEED)
}
